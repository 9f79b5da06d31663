package sbclaim_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
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

// Route.HoldSessionOnFailure through the public API: a declined entry
// holds its session (the next entry does not run), and the claims of the
// session are listed by ClaimFilter.SessionID.
func TestSessionHeldOnFailureThroughTheAPI(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	var mu sync.Mutex
	var seen []string
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "ledger", HoldSessionOnFailure: true, Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, d.Message().MessageID)
		if d.Message().MessageID == "acct-1" {
			return sbclaim.Rejected(errors.New("insufficient funds"))
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	q := sbclaimtest.NewQueue(&sbclaimtest.QueueOptions{Sessions: true})
	logs := &lockedBuffer{}
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "ledger", Store: st, Router: router,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}, q)
	session := "account-42"
	for _, id := range []string{"acct-1", "acct-2"} {
		m := message(id, "ledger.entry", `{}`)
		m.SessionID = &session
		send(t, q, m)
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "session held until an operator acts on the claim") {
		if time.Now().After(deadline) {
			t.Fatalf("the session was not held:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cs, err := st.Claims(ctx, sbclaim.ClaimFilter{SessionID: session})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].State != sbclaim.StateFailed || cs[0].SessionID != session || len(q.DeadLetters()) != 1 {
		t.Fatalf("the session's claims %+v, dead letters %d: want acct-1's, failed, dead-lettered once", cs, len(q.DeadLetters()))
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, []string{"acct-1"}) {
		t.Errorf("handler saw %v: acct-2 must wait while its session is held", seen)
	}
}

// lockedBuffer is a log sink safe for the processor's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
