package chaos

import (
	"context"

	"github.com/sbclaim/sbclaim/internal/claim"
)

func (s *gateStore) Overview(ctx context.Context, p *claim.OverviewParams) (*claim.Overview, error) {
	if err := s.pass(ctx, "Overview", 0); err != nil {
		return nil, err
	}
	return s.inner.Overview(ctx, p)
}
