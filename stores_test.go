package sbclaim_test

// The stores the tests open (the root package links none).
import (
	_ "github.com/sbclaim/sbclaim/store/postgres"
	_ "github.com/sbclaim/sbclaim/store/sqlite"
	_ "github.com/sbclaim/sbclaim/store/sqlserver"
)
