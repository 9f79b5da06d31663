package mssql_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/mssql"
)

// Open a store (here with a user-assigned managed identity on Azure SQL),
// migrate it, and claim a message. Compiled, not run: there is no SQL
// Server on the build machines.
func ExampleOpen() {
	// Every call gets a deadline: go-mssqldb can otherwise wait forever on
	// a connection that broke inside a transaction.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	st, err := mssql.Open(ctx, "sqlserver://sql-sbclaim.database.windows.net?database=sbclaim&encrypt=true&fedauth=ActiveDirectoryManagedIdentity")
	if err != nil {
		log.Fatal(err) // the password, if any, is redacted
	}
	defer st.Close()
	if err := mssql.Migrate(ctx, st.DB()); err != nil {
		log.Fatal(err)
	}

	body := []byte(`{"amount":42}`)
	res, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{
		Host: "replica-1",
		Claims: []claim.ClaimParams{{
			Owner:     uuid.New(),
			MessageID: "order-1001", Consumer: "billing", Entity: "orders",
			PayloadHash: claim.HashPayload(body), Payload: body, DeliveryCount: 1,
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res[0].Outcome)
}
