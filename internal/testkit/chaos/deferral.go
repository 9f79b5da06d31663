package chaos

import (
	"context"
	"errors"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// Delayed retries through the harness's store chain: every wrapper passes
// claim.Deferrer on, so the replicas defer retryable messages (the
// product's default) instead of abandoning them. The gate refuses the
// calls of a dead replica and during a store outage like any other; the
// trace records them in the history and the ledger (a deferral releases
// the claim; a take of a due claim is a take-over by redelivery).

var (
	_ claim.Deferrer = (*gateStore)(nil)
	_ claim.Deferrer = (*traceStore)(nil)
	_ claim.Deferrer = (*lostAckStore)(nil)
)

var errNoDeferrer = errors.New("chaos: the store has no delayed retries (claim.Deferrer)")

func deferrerOf(s claim.Store) (claim.Deferrer, error) {
	d, ok := s.(claim.Deferrer)
	if !ok {
		return nil, errNoDeferrer
	}
	return d, nil
}

func (s *gateStore) Defer(ctx context.Context, p *claim.DeferParams) error {
	if err := s.pass(ctx, "Defer", p.ID); err != nil {
		return err
	}
	d, err := deferrerOf(s.inner)
	if err != nil {
		return err
	}
	return s.land("Defer", p.ID, p.Owner, d.Defer(ctx, p))
}

func (s *gateStore) SetDue(ctx context.Context, p *claim.SetDueParams) error {
	if err := s.pass(ctx, "SetDue", p.ID); err != nil {
		return err
	}
	d, err := deferrerOf(s.inner)
	if err != nil {
		return err
	}
	return d.SetDue(ctx, p)
}

func (s *gateStore) FindDue(ctx context.Context, p *claim.FindDueParams) ([]*claim.Claim, error) {
	if err := s.pass(ctx, "FindDue", 0); err != nil {
		return nil, err
	}
	d, err := deferrerOf(s.inner)
	if err != nil {
		return nil, err
	}
	return d.FindDue(ctx, p)
}

func (s *gateStore) TakeDeferred(ctx context.Context, p *claim.TakeDeferredParams) (*claim.Claim, error) {
	if err := s.pass(ctx, "TakeDeferred", p.ID); err != nil {
		return nil, err
	}
	d, err := deferrerOf(s.inner)
	if err != nil {
		return nil, err
	}
	return d.TakeDeferred(ctx, p)
}

func (s *traceStore) Defer(ctx context.Context, p *claim.DeferParams) error {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return err
	}
	err = d.Defer(ctx, p)
	if err == nil {
		s.led.released(p.Owner)
	}
	s.hist.add(s.hist.keyOf(p.ID), "%s Defer claim %d (owner %.8s, seq %d, due in %s, cause %q): %s",
		s.host, p.ID, p.Owner, p.Seq, p.DueIn.Round(time.Millisecond), p.Error, errText(err))
	return err
}

func (s *traceStore) SetDue(ctx context.Context, p *claim.SetDueParams) error {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return err
	}
	err = d.SetDue(ctx, p)
	s.hist.add(s.hist.keyOf(p.ID), "%s SetDue claim %d (seq %d, due in %s): %s", s.host, p.ID, p.Seq, p.DueIn.Round(time.Millisecond), errText(err))
	return err
}

func (s *traceStore) FindDue(ctx context.Context, p *claim.FindDueParams) ([]*claim.Claim, error) {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return nil, err
	}
	return d.FindDue(ctx, p)
}

func (s *traceStore) TakeDeferred(ctx context.Context, p *claim.TakeDeferredParams) (*claim.Claim, error) {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	c, err := d.TakeDeferred(ctx, p)
	end := time.Now()
	key := s.hist.keyOf(p.ID)
	if err == nil {
		s.led.tookOver(key, s.host, &claim.TakeOverParams{ID: p.ID, PreviousOwner: p.PreviousOwner, Owner: p.Owner,
			Path: claim.PathRedelivery, SilentFor: p.SilentFor, By: p.By, Reason: p.Reason}, start, end)
	}
	s.led.maybeGranted(key, s.host, p.Owner, err)
	s.hist.add(key, "%s TakeDeferred claim %d (seq %d, from %.8s): %s", s.host, p.ID, p.Seq, p.PreviousOwner, errText(err))
	return c, err
}

func (s *lostAckStore) Defer(ctx context.Context, p *claim.DeferParams) error {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return err
	}
	return d.Defer(ctx, p)
}

func (s *lostAckStore) SetDue(ctx context.Context, p *claim.SetDueParams) error {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return err
	}
	return d.SetDue(ctx, p)
}

func (s *lostAckStore) FindDue(ctx context.Context, p *claim.FindDueParams) ([]*claim.Claim, error) {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return nil, err
	}
	return d.FindDue(ctx, p)
}

func (s *lostAckStore) TakeDeferred(ctx context.Context, p *claim.TakeDeferredParams) (*claim.Claim, error) {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return nil, err
	}
	return d.TakeDeferred(ctx, p)
}

func (s *gateStore) FindStranded(ctx context.Context, p *claim.FindDueParams) ([]*claim.Claim, error) {
	if err := s.pass(ctx, "FindStranded", 0); err != nil {
		return nil, err
	}
	d, err := deferrerOf(s.inner)
	if err != nil {
		return nil, err
	}
	return d.FindStranded(ctx, p)
}

func (s *gateStore) TakeStranded(ctx context.Context, p *claim.TakeStrandedParams) error {
	if err := s.pass(ctx, "TakeStranded", p.ID); err != nil {
		return err
	}
	d, err := deferrerOf(s.inner)
	if err != nil {
		return err
	}
	return d.TakeStranded(ctx, p)
}

func (s *gateStore) ClearDeferred(ctx context.Context, p *claim.ClearDeferredParams) error {
	if err := s.pass(ctx, "ClearDeferred", p.ID); err != nil {
		return err
	}
	d, err := deferrerOf(s.inner)
	if err != nil {
		return err
	}
	return d.ClearDeferred(ctx, p)
}

func (s *traceStore) FindStranded(ctx context.Context, p *claim.FindDueParams) ([]*claim.Claim, error) {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return nil, err
	}
	return d.FindStranded(ctx, p)
}

func (s *traceStore) TakeStranded(ctx context.Context, p *claim.TakeStrandedParams) error {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return err
	}
	err = d.TakeStranded(ctx, p)
	s.hist.add(s.hist.keyOf(p.ID), "%s TakeStranded claim %d (%s, seq %d): %s", s.host, p.ID, p.State, p.Seq, errText(err))
	return err
}

func (s *traceStore) ClearDeferred(ctx context.Context, p *claim.ClearDeferredParams) error {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return err
	}
	err = d.ClearDeferred(ctx, p)
	s.hist.add(s.hist.keyOf(p.ID), "%s ClearDeferred claim %d (seq %d): %s", s.host, p.ID, p.Seq, errText(err))
	return err
}

func (s *lostAckStore) FindStranded(ctx context.Context, p *claim.FindDueParams) ([]*claim.Claim, error) {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return nil, err
	}
	return d.FindStranded(ctx, p)
}

func (s *lostAckStore) TakeStranded(ctx context.Context, p *claim.TakeStrandedParams) error {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return err
	}
	return d.TakeStranded(ctx, p)
}

func (s *lostAckStore) ClearDeferred(ctx context.Context, p *claim.ClearDeferredParams) error {
	d, err := deferrerOf(s.Store)
	if err != nil {
		return err
	}
	return d.ClearDeferred(ctx, p)
}
