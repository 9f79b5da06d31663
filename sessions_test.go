package sbclaim_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// A session-enabled queue through the public API: each session's
// messages take effect in order, and a handler that asks for a retry
// holds its session (the next message waits) instead of being overtaken.
func TestSessionsKeepTheOrderThroughTheAPI(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	var mu sync.Mutex
	var seen []string
	tries := map[string]int{}
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "ledger", Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		id := d.Message().MessageID
		tries[id]++
		seen = append(seen, id)
		if id == "acct-1" && tries[id] == 1 {
			return sbclaim.NotPerformed(errors.New("ledger busy"))
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	q := sbclaimtest.NewQueue(&sbclaimtest.QueueOptions{Sessions: true})
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "ledger", Store: st, Router: router}, q)
	session := "account-42"
	for _, id := range []string{"acct-1", "acct-2", "acct-3"} {
		m := message(id, "ledger.entry", `{}`)
		m.SessionID = &session
		send(t, q, m)
	}
	waitIdle(t, q)
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"acct-1", "acct-1", "acct-2", "acct-3"}; !slices.Equal(seen, want) {
		t.Errorf("handler saw %v, want %v: the retry holds the session", seen, want)
	}
}

func TestSessionsConfigIsChecked(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	router, _ := sbclaim.NewRouter(sbclaim.Route{Name: "r", Handler: func(context.Context, *sbclaim.Delivery) error { return nil }})
	accept := func(context.Context) (sbclaim.SessionReceiver, error) {
		return nil, &azservicebus.Error{Code: azservicebus.CodeTimeout}
	}
	q := sbclaimtest.NewQueue(nil)
	for name, cfg := range map[string]sbclaim.ProcessorConfig{
		"both":          {Consumer: "c", Store: st, Router: router, NewReceiver: q.NewReceiver, Sessions: &sbclaim.Sessions{AcceptNext: accept}},
		"no accept":     {Consumer: "c", Store: st, Router: router, Sessions: &sbclaim.Sessions{}},
		"negative idle": {Consumer: "c", Store: st, Router: router, Sessions: &sbclaim.Sessions{AcceptNext: accept, IdleTimeout: -1}},
	} {
		if _, err := sbclaim.NewProcessor(cfg); err == nil {
			t.Errorf("%s: NewProcessor accepted it", name)
		}
	}
	if _, err := sbclaim.NewProcessor(sbclaim.ProcessorConfig{Consumer: "c", Store: st, Router: router, Sessions: &sbclaim.Sessions{AcceptNext: accept}}); err != nil {
		t.Errorf("a session config: %v", err)
	}
}

// sessionsConfig is the configuration docs/sessions.md shows.
func sessionsConfig(client *azservicebus.Client, cfg *sbclaim.ProcessorConfig) {
	// snippet:sessions-config
	cfg.Sessions = &sbclaim.Sessions{
		AcceptNext: func(ctx context.Context) (sbclaim.SessionReceiver, error) {
			return client.AcceptNextSessionForQueue(ctx, "ledger", nil)
		},
		MaxConcurrent: 8,
		IdleTimeout:   time.Minute,
	}
	// endsnippet
}

func TestSessionsSnippetConfigures(t *testing.T) {
	var cfg sbclaim.ProcessorConfig
	sessionsConfig(nil, &cfg)
	if cfg.Sessions == nil || cfg.Sessions.AcceptNext == nil || cfg.Sessions.MaxConcurrent != 8 || cfg.Sessions.IdleTimeout != time.Minute {
		t.Fatalf("the docs' session config: %+v", cfg.Sessions)
	}
}
