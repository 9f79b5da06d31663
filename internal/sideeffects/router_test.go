package sideeffects

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

func TestNewRouterChecksRoutes(t *testing.T) {
	t.Parallel()
	eff := EffectFunc(func(context.Context, *azservicebus.ReceivedMessage, string) error { return nil })
	tx := TxEffectFunc(func(context.Context, *sql.Tx, *azservicebus.ReceivedMessage, string) error { return nil })
	_, err := NewRouter(
		Route{Name: "a", Match: Match{Subject: "s"}, Effect: eff},
		Route{Name: "a", Match: Match{Subject: "s"}, Effect: eff},
		Route{Name: "", Match: Match{Subject: "s"}, Effect: eff},
		Route{Name: "both", Match: Match{Subject: "s"}, Effect: eff, TxEffect: tx},
		Route{Name: "neither", Match: Match{Subject: "s"}},
		Route{Name: "nosubject", Effect: eff},
	)
	if err == nil {
		t.Fatal("NewRouter accepted bad routes")
	}
	for _, w := range []string{`"a": Name is used twice`, "route 2: Name is required", `"both": exactly one`, `"neither": exactly one`, `"nosubject": Match.Subject`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

func TestRoutesAndChain(t *testing.T) {
	t.Parallel()
	eff := EffectFunc(func(context.Context, *azservicebus.ReceivedMessage, string) error { return nil })
	tx := TxEffectFunc(func(context.Context, *sql.Tx, *azservicebus.ReceivedMessage, string) error { return nil })
	goRoutes, err := NewRouter(
		Route{Name: "ledger", Match: Match{Subject: "credit"}, TxEffect: tx, JSONBody: true},
		Route{Name: "tenant-a", Match: Match{Subject: "mail", Property: &PropertyMatch{Name: "tenant", Value: "42"}}, Effect: eff},
	)
	if err != nil {
		t.Fatal(err)
	}
	catchAll, err := NewRouter(Route{Name: "catch-all", Match: Match{Subject: AnySubject}, Effect: eff})
	if err != nil {
		t.Fatal(err)
	}
	r := Chain(goRoutes, catchAll)

	credit := newMsg("1", "credit", `{"amount":5}`)
	if h, err := r.Route(credit); err != nil || h.Name != "ledger" || h.TxEffect == nil || h.Effect != nil {
		t.Errorf("credit: %+v, %v", h, err)
	}
	mail := newMsg("2", "mail", ``)
	mail.ApplicationProperties["tenant"] = int64(42) // compared as text
	if h, err := r.Route(mail); err != nil || h.Name != "tenant-a" || h.Effect == nil {
		t.Errorf("mail: %+v, %v", h, err)
	}
	noSubject := newMsg("3", "", ``)
	noSubject.Subject = nil
	if h, err := r.Route(noSubject); err != nil || h.Name != "catch-all" {
		t.Errorf("no subject: %+v, %v", h, err)
	}
	// A malformed body stops the chain (it is not "no route").
	_, err = r.Route(newMsg("4", "credit", `{`))
	var ie *InputError
	if !errors.As(err, &ie) || ie.Reason != ReasonMalformedBody {
		t.Errorf("malformed credit: %v", err)
	}
	// Without the catch-all: NoRoute.
	if _, err := Chain(goRoutes).Route(newMsg("5", "other", ``)); !errors.As(err, &ie) || ie.Reason != ReasonNoRoute {
		t.Errorf("other: %v", err)
	}
}
