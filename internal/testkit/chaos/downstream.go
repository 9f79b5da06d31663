package chaos

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// downWindow is a window of time during which the downstream refuses
// every request: FaultDownstreamOutage (half the requests are refused at
// connect, ECONNREFUSED; the others are answered 503) or
// FaultMisconfigured (every request is answered 401, as with a wrong API
// key, until the "fix" at the window's end).
type downWindow struct {
	fault  Fault
	active atomic.Bool
	n      atomic.Int64 // requests refused

	mu         sync.Mutex
	start, end time.Time
	keys       map[string]bool // message IDs whose requests the window refused
}

func (w *downWindow) refuse(key string) {
	w.n.Add(1)
	if key == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.keys == nil {
		w.keys = map[string]bool{}
	}
	w.keys[key] = true
}

func (w *downWindow) touched(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.keys[key]
}

// downWindows returns the downstream windows of the run's faults, in the
// order they open.
func (h *harness) downWindows() []*downWindow {
	var out []*downWindow
	for _, w := range []*downWindow{&h.outageWin, &h.misconfWin} {
		if h.enabled(w.fault) {
			out = append(out, w)
		}
	}
	return out
}

// activeWindow returns the downstream window now open, if any.
func (h *harness) activeWindow() *downWindow {
	for _, w := range []*downWindow{&h.outageWin, &h.misconfWin} {
		if w.active.Load() {
			return w
		}
	}
	return nil
}

// outageTransport refuses connections during a downstream outage: every
// other request fails at dial with ECONNREFUSED (the effect is surely not
// performed); the others reach serveDownstream, which answers 503.
type outageTransport struct {
	base http.RoundTripper
	h    *harness
	n    atomic.Int64
}

func (t *outageTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if w := t.h.activeWindow(); w != nil && w.fault == FaultDownstreamOutage && t.n.Add(1)%2 == 0 {
		if req.Body != nil {
			req.Body.Close()
		}
		w.refuse(idOfKey(req.Header.Get("Idempotency-Key")))
		t.h.hist.add(idOfKey(req.Header.Get("Idempotency-Key")), "downstream outage: connection refused")
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	return t.base.RoundTrip(req)
}

// refuseDownstream answers a request the open window refuses (503 in an
// outage, 401 while misconfigured) and reports whether it did.
func (h *harness) refuseDownstream(w http.ResponseWriter, r *http.Request) bool {
	win := h.activeWindow()
	if win == nil {
		return false
	}
	key := idOfKey(r.Header.Get("Idempotency-Key"))
	win.refuse(key)
	switch win.fault {
	case FaultMisconfigured:
		h.hist.add(key, "downstream misconfigured: answered 401")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":{"type":"invalid_request_error","message":"Invalid API Key provided"}}`)
	default:
		h.hist.add(key, "downstream outage: answered 503")
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	return true
}

// monitorDownstream opens the downstream windows one after the other: the
// outage once a quarter of the sends are settled, the misconfiguration
// once half are (and the outage, if on, is over).
func (h *harness) monitorDownstream(ctx context.Context) {
	total := len(h.sent)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for _, w := range h.downWindows() {
		threshold := total / 4
		if w.fault == FaultMisconfigured {
			threshold = total / 2
		}
		for {
			st := h.queue.Stats()
			if st.Completed+st.DeadLettered >= threshold {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		h.log.Info("downstream window begins", "fault", w.fault, "duration", h.cfg.DownstreamWindow)
		w.mu.Lock()
		w.start = time.Now()
		w.mu.Unlock()
		w.active.Store(true)
		h.book.count(w.fault, 1)
		select {
		case <-ctx.Done():
		case <-time.After(h.cfg.DownstreamWindow):
		}
		w.active.Store(false)
		w.mu.Lock()
		w.end = time.Now()
		w.mu.Unlock()
		h.log.Info("downstream window ends", "fault", w.fault)
	}
}

// WindowReport is what a downstream window (downstream-outage,
// misconfigured) did.
type WindowReport struct {
	Fault    Fault
	Duration time.Duration
	Refused  int64 // requests refused
	Keys     int   // messages whose requests it refused
	// PerformedAfter counts those messages whose effect was performed
	// after the window ended (all of them, or the run fails).
	PerformedAfter int
	// PerformedBefore counts those whose effect had been performed before
	// the window began: the refused request was a repeat (a holder that
	// took over a claim whose outcome was not recorded yet).
	PerformedBefore int
	// LastEffect is the time from the window's end to the last effect of
	// a message it refused.
	LastEffect time.Duration
}

// checkWindows fills the report's windows and checks that every message
// a window refused was performed once, after it ended.
func (h *harness) checkWindows(rep *Report) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.downWindows() {
		w.mu.Lock()
		wr := WindowReport{Fault: w.fault, Duration: w.end.Sub(w.start), Refused: w.n.Load(), Keys: len(w.keys)}
		if w.end.IsZero() {
			rep.violate("%s: the window never closed", w.fault)
			w.mu.Unlock()
			rep.Windows = append(rep.Windows, wr)
			continue
		}
		for key := range w.keys {
			at, ok := h.effectAt[key]
			_, odd := h.answers[key]
			switch {
			case odd:
			case !ok:
				rep.violate("%s: %s was refused by the window and never performed", w.fault, key)
			case at.Before(w.start):
				// Performed before the window: the refused request was a
				// repeat (a recovery of a claim whose outcome was not
				// recorded).
				wr.PerformedBefore++
			case !at.After(w.end):
				rep.violate("%s: %s performed at %s, before the window ended (%s)", w.fault, key, at.Format(time.TimeOnly), w.end.Format(time.TimeOnly))
			default:
				wr.PerformedAfter++
				wr.LastEffect = max(wr.LastEffect, at.Sub(w.end))
			}
		}
		w.mu.Unlock()
		rep.Windows = append(rep.Windows, wr)
	}
}
