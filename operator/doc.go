// Package operator is sbclaim for the people and programs that run it,
// beside package sbclaim's handlers, routes and processor:
//
//   - the Reconciler: the periodic passes that recover stale claims with
//     the program's handlers, flag what a person must decide and purge
//     old claims (NewReconciler, with the processors' routers);
//   - the actions on flagged and failed claims: Resolve, Redrive,
//     HandOff and Retry, each a guarded, audited write that fails with an
//     *ActionError saying how;
//   - a claim's History;
//   - the migrations, for a migration pipeline of one's own (Migrations;
//     sbclaim.Migrate applies them).
//
// The reconciler command (run, list, show, resolve, redrive, retry, the
// console) is built on it. Claims are read with sbclaim.Store's Claim,
// Claims and AllClaims.
package operator
