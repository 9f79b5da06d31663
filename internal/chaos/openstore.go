package chaos

import (
	"context"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/store"
)

// openStore migrates and opens the product's claim store for url, the way
// the binaries do (with the store's own pool limits). All replicas of a run
// share it.
func openStore(ctx context.Context, _ Dialect, url string) (claim.Store, error) {
	if err := store.Migrate(ctx, url); err != nil {
		return nil, err
	}
	return store.Open(ctx, url)
}
