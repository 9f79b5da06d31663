// Package deploy holds the Azure Container Apps deployment (main.bicep and
// its modules) and tests that keep it consistent with the binaries and
// with the documentation: every SBCLAIM_ variable it sets is one the binary
// reads, the Microsoft.App API versions are the pinned ones, the example
// parameters name real parameters, the example routes file loads, and the
// windows it configures (shutdown vs grace period, stale-after vs
// heartbeat, retention vs lock × deliveries) are valid; the first pass
// deploys no app and every output is available after it; the SQL
// statements are idempotent; a routes or secret change changes the
// template; only an app's own identity reaches its code (identitySettings);
// the role assignments are scoped to the entity and are the ones the
// privileges table of docs/deploy.md lists; and the deploy commands of
// docs/deploy.md and docs/console.md name files, parameters, outputs and
// tools that exist. These are text-level
// checks: the Bicep compiler is not available on the build machines.
package deploy
