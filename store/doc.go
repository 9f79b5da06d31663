// Package store holds one package per claims database. Import the ones a
// program uses, for their effect, and sbclaim.OpenStore and sbclaim.Migrate
// open and migrate URLs of their dialect; the root package links no
// database driver itself:
//
//	import _ "github.com/sbclaim/sbclaim/store/sqlite"    // sqlite:
//	import _ "github.com/sbclaim/sbclaim/store/postgres"  // postgres://, postgresql://
//	import _ "github.com/sbclaim/sbclaim/store/sqlserver" // sqlserver://
//
// OpenStore with a URL whose store is not imported fails with an error
// naming the package to import.
package store
