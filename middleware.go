package sbclaim

// Middleware decorates a route's handler: logging, a tenant in the
// context, metrics, a test's fault injection. It returns a handler that
// does its work and calls next (or returns without calling it: the effect
// is then not performed, so return NotPerformed or another outcome that
// says so).
//
// The order: the router's middleware (Router.Use), in the order given,
// then the route's own (Route.Middleware), then the handler — the first
// is the outermost, it sees the handler's error last:
//
//	r.Use(a, b)               // a(b(route's(handler)))
//	Route{Middleware: []Middleware{c}, ...}  // a(b(c(handler)))
//
// It runs on every attempt, take-over, recovery and redrive of a Go
// route; the routes file's HTTP routes have none. For a TxHandler route,
// next runs the handler inside the claim's transaction: the middleware
// runs inside it too, and must not write to the database outside it.
//
// A panic in the handler passes through the middleware to the processor,
// which records the outcome as unknown: a middleware must not recover a
// panic into nil (that would record an effect that may not have happened
// as performed); one that recovers must return a plain error (unknown).
type Middleware func(next HandlerFunc) HandlerFunc

// Use adds middleware that wraps the handler of every Go route of r,
// those added before and after it alike, outside each route's own
// (see Middleware for the order). Call it before passing r to
// NewProcessor or operator.NewReconciler.
func (r *Router) Use(mw ...Middleware) {
	r.use = append(r.use, mw...)
}

// wrap returns h inside the route's middleware, inside the router's.
func (r *Router) wrap(route []Middleware, h HandlerFunc) HandlerFunc {
	for i := len(route) - 1; i >= 0; i-- {
		h = route[i](h)
	}
	for i := len(r.use) - 1; i >= 0; i-- {
		h = r.use[i](h)
	}
	return h
}
