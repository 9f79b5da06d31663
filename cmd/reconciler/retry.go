package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/sbclaim/sbclaim"
	ops "github.com/sbclaim/sbclaim/operator"
)

// maxRetryBulk bounds one retry command, like the console's bulk actions
// (console.MaxBulk).
const maxRetryBulk = 100

// retryFlags is `reconciler retry`: run failed claims again after the
// cause of their failure was fixed, one by id or in bulk (--failed).
func retryFlags(fs *flag.FlagSet) func(context.Context, *env, []string) int {
	by := fs.String("by", "", "operator name (default: $SBCLAIM_OPERATOR, else the OS user)")
	note := fs.String("note", "", "what was fixed (required), kept in each claim's history")
	newKey := fs.Bool("new-key", false, "retry under a new idempotency key (the claim's key with :r<N>): only for a route with allowNewKey, "+
		"for a downstream that stored its failure under the old key")
	handOff := fs.Bool("handoff", false, "for claims whose route is a Go handler in your own binary: release them for the reconciler "+
		"passes running in that binary")
	failed := fs.Bool("failed", false, "retry the failed claims the filters match (at most --limit, oldest id first) instead of ids")
	consumer := fs.String("consumer", "", "with --failed: only claims of this consumer")
	route := fs.String("route", "", "with --failed: only claims taken for this route")
	limit := fs.Int("limit", maxRetryBulk, fmt.Sprintf("with --failed: at most this many claims (1..%d)", maxRetryBulk))
	return func(ctx context.Context, e *env, args []string) int {
		switch {
		case strings.TrimSpace(*note) == "":
			fmt.Fprintln(e.stderr, "reconciler retry: --note is required: say what was fixed, for whoever reads these claims next")
			return exitUsage
		case *failed && len(args) > 0:
			fmt.Fprintln(e.stderr, "reconciler retry: give claim ids or --failed, not both")
			return exitUsage
		case !*failed && len(args) == 0:
			fmt.Fprintln(e.stderr, "reconciler retry: want one or more claim ids, or --failed")
			return exitUsage
		case len(args) > maxRetryBulk || *limit < 1 || *limit > maxRetryBulk:
			fmt.Fprintf(e.stderr, "reconciler retry: at most %d claims at a time\n", maxRetryBulk)
			return exitUsage
		case !*handOff && e.cfg.RoutesPath == "":
			fmt.Fprintln(e.stderr, "reconciler retry: SBCLAIM_ROUTES (--routes) is required: the processors' routes file (or consumer=path pairs); "+
				"for claims whose route is a Go handler in your own binary, use --handoff")
			return exitUsage
		}
		var ids []int64
		for _, a := range args {
			id, err := strconv.ParseInt(a, 10, 64)
			if err != nil || id < 1 {
				fmt.Fprintf(e.stderr, "reconciler retry: %q is not a claim id\n", a)
				return exitUsage
			}
			ids = append(ids, id)
		}
		operator, err := e.operator(*by)
		if err != nil {
			fmt.Fprintf(e.stderr, "reconciler retry: %v\n", err)
			return exitUsage
		}
		var routers map[string]*sbclaim.Router
		if !*handOff {
			if routers, err = e.routes(); err != nil {
				return e.fail("retry", err)
			}
		}
		st, err := e.openStore(ctx)
		if err != nil {
			return e.fail("retry", err)
		}
		defer st.Close()
		if *failed {
			cs, err := st.Claims(ctx, sbclaim.ClaimFilter{States: []sbclaim.ClaimState{sbclaim.StateFailed}, Consumer: *consumer,
				Route: *route, Limit: *limit})
			if err != nil {
				return e.fail("retry", err)
			}
			for _, c := range cs {
				ids = append(ids, c.ID)
			}
			if len(ids) == 0 {
				fmt.Fprintln(e.stdout, "no failed claims match")
				return exitOK
			}
		}
		code := exitOK
		var retried, refused, failedAgain int
		for _, id := range ids {
			if err := ctx.Err(); err != nil {
				return e.fail("retry", err)
			}
			c, err := ops.Retry(ctx, st, id, ops.RetryOptions{By: operator, Note: *note, NewKey: *newKey, Routers: routers, Logger: e.logger,
				HeartbeatInterval: e.cfg.HeartbeatInterval, QueryTimeout: e.cfg.QueryTimeout})
			var act *ops.ActionError
			switch {
			case err == nil && c.State == sbclaim.StateReleased:
				retried++
				fmt.Fprintf(e.stdout, "claim %d retried by %s: released with idempotency key %s for the binary that runs route %s "+
					"(without a stored payload: re-submit its dead letter)\n", c.ID, printable(operator, 0), printable(c.IdempotencyKey, 0), dash(strconv.Quote(c.Route)))
			case err == nil:
				retried++
				fmt.Fprintf(e.stdout, "claim %d retried by %s: the effect succeeded with idempotency key %s; resolved as %s\n",
					c.ID, printable(operator, 0), printable(c.IdempotencyKey, 0), c.Resolution)
			case errors.As(err, &act) && act.Kind == ops.ActionRefused:
				refused++
				e.refuse("retry", id, err)
				code = exitFailure
			case errors.As(err, &act) && act.Kind == ops.ActionEffectFailed:
				failedAgain++
				state := "flagged again"
				if act.Failed {
					state = "failed again (fix the cause, then retry it again)"
				}
				fmt.Fprintf(e.stderr, "reconciler retry: claim %d: the effect failed with idempotency key %s (outcome %s): %v; the claim is %s\n",
					id, printable(act.IdempotencyKey, 0), act.Outcome, act.Err, state)
				code = exitFailure
			default:
				e.refuse("retry", id, err)
				code = exitFailure
			}
		}
		if len(ids) > 1 {
			fmt.Fprintf(e.stdout, "%d retried, %d refused, %d failed again, of %d\n", retried, refused, failedAgain, len(ids))
		}
		return code
	}
}
