package main

// The claims stores this command opens: every dialect's (the root package
// links none).
import (
	_ "github.com/sbclaim/sbclaim/store/postgres"
	_ "github.com/sbclaim/sbclaim/store/sqlite"
	_ "github.com/sbclaim/sbclaim/store/sqlserver"
)
