// Command settlement is an invoice-batch settlement worker written against
// lockwarden: it acquires a lease on the batch through the
// Kubernetes API server, then settles the batch in a PostgreSQL database as
// a fenced multi-segment operation through pkg/store/postgres.
//
//	settlement --kubeconfig ~/.kube/config --cluster prod-eu1 --namespace billing \
//	    --dsn 'postgres://settlement@127.0.0.1:5432/billing?sslmode=disable' \
//	    --batch 2026-07-19 --invoices 12 --segment-size 4
//
// What it does:
//
//  1. Creates a LockGrant for resource "invoice-batch/BATCH", bound to the
//     batch's operation root (spec.operationRoot), and watches it until the
//     controller reports it Held; reads its fence token.
//  2. Applies the schema (pkg/store/postgres.Migrate and its own
//     settlement_invoices table). The store keys its records by --cluster
//     (the lockwarden installation that issues the fences), --namespace and
//     the resource ID, and the invoices are keyed by namespace: the same
//     batch settled in two namespaces against one database is two
//     independent settlements. A database written before
//     records were keyed this way is refused until the run is started
//     with --adopt-legacy-records, which assigns those records to this
//     cluster and namespace.
//  3. Cuts the batch into segments of --segment-size invoices. The
//     operation root is the SHA-256 of the whole batch, so a rerun of the
//     same batch (after a crash, or by another worker) continues the same
//     operation: segments already settled are answered with their original
//     receipts and are not settled twice.
//  4. Each segment settles its invoices and records the fence bookkeeping
//     in one transaction. A refusal (STALE_OWNER: a newer worker took over;
//     FENCE_REGRESSION: the registry was restored) stops the worker; a
//     FENCE_REGRESSION is also reported on the worker's grant (annotation
//     locking.lockwarden.io/fence-regression), so that the controller
//     raises the grant's FenceRegression condition, a Warning Event and
//     the metric lockwarden_grant_transitions_total{reason="FENCE_REGRESSION"}. A
//     commit whose answer was lost (MUTATION_UNKNOWN) is looked up by
//     operation root and segment, and resent only when the lookup does not
//     find it (a resend with the same payload is idempotent).
//  5. Releases the grant.
//
// Every step is printed as one line. The exit code is 0 when the batch is
// settled, 1 when the worker stopped before (the operation stays partially
// applied, visible in lockwarden_receipts, for the next run to continue).
//
// The lease is not renewed: choose --ttl longer than the batch takes. A
// worker whose lease ran out is refused by the store and stops.
package main
