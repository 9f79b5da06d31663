package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

func TestParseConfig(t *testing.T) {
	t.Parallel()
	env := map[string]string{"SBCLAIM_DEMOAPI_ADDR": "127.0.0.1:0", "SBCLAIM_DEMOAPI_FAULT": "hang", "SBCLAIM_DEMOAPI_FAULT_RATE": "0.25"}
	c, err := parseConfig([]string{"-latency", "20ms"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:0" || c.Latency != 20*time.Millisecond || c.Fault != fakedownstream.FaultHang || c.FaultRate != 0.25 || c.Seed != 1 {
		t.Errorf("config = %+v", c)
	}
	c, err = parseConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil || c.Addr != ":8080" || c.Conflicts != fakedownstream.Conflict422 {
		t.Errorf("defaults: %+v, %v", c, err)
	}
	c, err = parseConfig([]string{"-conflict-style", "stripe"}, func(string) string { return "" }, io.Discard)
	if err != nil || c.Conflicts != fakedownstream.ConflictStripe {
		t.Errorf("-conflict-style stripe: %+v, %v", c, err)
	}
	for _, args := range [][]string{
		{"-fault-rate", "2", "-fault", "hang"},
		{"-fault-rate", "0.5"},
		{"-fault", "boom"},
		{"-latency", "soon"},
		{"-conflict-style", "409"},
	} {
		if _, err := parseConfig(args, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func TestRunServesTheFake(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() {
		done <- run(ctx, config{Addr: "127.0.0.1:0", Seed: 1}, logger, func(a string) { addrc <- a })
	}()
	var base string
	select {
	case a := <-addrc:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("run: %v", err)
	}

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("POST /payments: %d", resp.StatusCode)
		}
	}
	resp, err := http.Get(base + "/_counts")
	if err != nil {
		t.Fatal(err)
	}
	var c fakedownstream.Counts
	err = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if err != nil || c.TotalEffects != 1 || c.Keys["k"].Requests != 2 {
		t.Errorf("/_counts = %+v, %v", c, err)
	}
	if resp, err := http.Get(base + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Errorf("/healthz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("run after cancel: %v", err)
	}
}
