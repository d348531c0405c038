// Command kubectl-lock is the kubectl plugin for lockwarden's fenced locks,
// built as kubectl-lockwarden (and as kubectl-lock for compatibility):
// installed on $PATH it runs as `kubectl lockwarden`. It takes, renews,
// releases and inspects LockGrants with the user's kubeconfig and the usual
// kubectl flags (--kubeconfig, --context, --namespace, ...), and
// `kubectl lockwarden run` protects a shell command: it holds the lock while
// the command runs, hands it the fence, and stops it the moment the lock is
// lost or in doubt.
//
//	kubectl lockwarden acquire RESOURCE [--ttl 30s] [--wait 0] [--request-id ID] [-o json|yaml]
//	kubectl lockwarden renew GRANT
//	kubectl lockwarden release GRANT
//	kubectl lockwarden status RESOURCE [-o json|yaml]
//	kubectl lockwarden list [--resource R] [--phase P] [--owner O] [-A] [-o json|yaml]
//	kubectl lockwarden run RESOURCE [--ttl 30s] [--wait 0] [--grace 10s] [-- COMMAND [ARG...]]
//	kubectl lockwarden version
//	kubectl lockwarden completion bash|zsh|fish|powershell
//
// `run` passes the command LOCKWARDEN_FENCE, LOCKWARDEN_GRANT (the grant's
// name), LOCKWARDEN_NAMESPACE, LOCKWARDEN_RESOURCE, LOCKWARDEN_GRANT_UID,
// LOCKWARDEN_REQUEST_ID and LOCKWARDEN_PROOF (the signed grant record);
// without a command, run holds the lock until interrupted. A guarded write
// made by the command carries
// annotations locking.lockwarden.io/grant=$LOCKWARDEN_NAMESPACE/$LOCKWARDEN_GRANT
// and locking.lockwarden.io/fence=$LOCKWARDEN_FENCE, and must be made as the
// same Kubernetes user. When ownership becomes doubtful or is lost, the
// command and every process it started get SIGTERM, then SIGKILL after
// --grace, which is bounded so that SIGKILL lands before the lease can
// expire; the fence makes any write it still sends useless, since the
// webhook refuses it. On Linux the command runs under a supervisor, this
// binary re-executed (see supervise), that follows every process the
// command starts and kills them all when the plugin dies.
//
// Exit codes:
//
//	0    success; for run, the command exited 0 while the lock was held
//	1    kubectl-lockwarden failed (usage, API errors) — every command but run
//	3    lockwarden refused, with the reason code first in the message
//	     (NOT_OWNER, EXPIRED, ALREADY_ENDED, NOT_HELD, REVOKED, UNKNOWN_GRANT,
//	     DRIVER_MISMATCH, ...); for run, before the command started
//	123  run: the lock was lost, or its ownership became unknown, while the
//	     command ran; the command was terminated
//	124  acquire, run: not acquired within --wait
//	125  run: kubectl-lockwarden itself failed (usage, API errors)
//	126  run: the command could not be executed
//	127  run: the command was not found
//	N    run: otherwise the command's own exit status (128+S when it was
//	     killed by signal S, or when signal S interrupted the wait)
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

func main() {
	// The supervisor of a run command (Linux) is this binary too.
	if code, ok := asSupervisor(os.Args[1:]); ok {
		os.Exit(code)
	}
	os.Exit(execute(os.Args[1:], genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}))
}
