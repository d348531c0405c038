package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// Exit codes; see the package documentation.
const (
	exitOK          = 0
	exitError       = 1
	exitRefused     = 3
	exitLockLost    = 123
	exitNotAcquired = 124
	exitRunFailed   = 125
	exitCannotExec  = 126
	exitNotFound    = 127
)

// exitErr carries an exit code out of a command; err, when set, is printed.
type exitErr struct {
	code int
	err  error
}

func (e *exitErr) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitErr) Unwrap() error { return e.err }

// classify gives a library or API error its exit code.
func classify(err error) error {
	var ee *exitErr
	var fe *fencing.Error
	switch {
	case err == nil || errors.As(err, &ee):
		return err
	case errors.Is(err, lock.ErrWaitTimeout), errors.Is(err, lock.ErrBusy):
		return &exitErr{code: exitNotAcquired, err: err}
	case errors.As(err, &fe), lock.Refusal(err) != nil:
		return &exitErr{code: exitRefused, err: err}
	}
	return &exitErr{code: exitError, err: err}
}

// execute runs the plugin with args and returns the process exit code.
func execute(args []string, streams genericiooptions.IOStreams) int {
	// controller-runtime's client may log through its global logger, which
	// would complain on stderr, with a stack trace, that none was set.
	logf.SetLogger(logr.Discard())
	root := newRootCmd(streams)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	var ee *exitErr
	if !errors.As(err, &ee) {
		ee = &exitErr{code: exitError, err: err}
		if cmd != nil && cmd.Name() == "run" {
			ee.code = exitRunFailed
		}
	}
	if ee.err != nil {
		fmt.Fprintf(streams.ErrOut, "kubectl-lockwarden: %v\n", ee.err)
	}
	return ee.code
}

// app is what every command shares: the kubectl flags and the streams.
type app struct {
	streams genericiooptions.IOStreams
	flags   *genericclioptions.ConfigFlags
}

func newRootCmd(streams genericiooptions.IOStreams) *cobra.Command {
	a := &app{streams: streams, flags: genericclioptions.NewConfigFlags(true)}
	root := &cobra.Command{
		Use:   "kubectl-lockwarden",
		Short: "Take, hold and inspect lockwarden's fenced locks",
		Long: `kubectl lockwarden takes, renews, releases and inspects lockwarden locks
(LockGrants), and runs a command while holding one.

Every grant carries a fencing token (the fence) that is strictly larger than
every token issued before for its resource. Guarded writes must carry it; a
holder that lost its lease cannot write any more, whatever it believes.

Exit codes:
  0    success; for run, the command exited 0 while the lock was held
  1    kubectl-lockwarden failed (usage, API errors), every command but run
  3    lockwarden refused, with the reason code first in the message (NOT_OWNER,
       EXPIRED, ALREADY_ENDED, NOT_HELD, REVOKED, UNKNOWN_GRANT,
       DRIVER_MISMATCH, ...); for run, before the command started
  123  run: the lock was lost or in doubt while the command ran; it was terminated
  124  acquire, run: not acquired within --wait
  125  run: kubectl-lockwarden itself failed
  126  run: the command could not be executed
  127  run: the command was not found
  N    run: otherwise the command's own exit status (128+S if killed by signal S,
       or if signal S interrupted the wait)

Shell completion: kubectl lockwarden completion bash|zsh|fish|powershell. For
completion through kubectl itself, put an executable kubectl_complete-lockwarden
on $PATH that runs: kubectl-lockwarden __complete "$@"`,
		Example: `  # Run a migration while holding the lock on db/orders; wait at most 5 minutes.
  kubectl lockwarden run db/orders --ttl 30s --wait 5m -- ./migrate.sh

  # Take a lock by hand, renew it, release it.
  kubectl lockwarden acquire reports/nightly --ttl 60s
  kubectl lockwarden renew req-0f3c...
  kubectl lockwarden release req-0f3c...

  # Who holds db/orders, and who waits?
  kubectl lockwarden status db/orders`,
		SilenceErrors: true,
		SilenceUsage:  true,
		// Shown in usage lines: the plugin is run as `kubectl lockwarden`.
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl lockwarden"},
	}
	a.flags.AddFlags(root.PersistentFlags())
	root.AddCommand(a.acquireCmd(), a.renewCmd(), a.releaseCmd(), a.statusCmd(), a.listCmd(), a.runCmd(), a.versionCmd())
	return root
}

// restConfig is the client configuration for the cluster the kubectl
// flags select.
func (a *app) restConfig() (*rest.Config, error) {
	cfg, err := a.flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	// Dead connections are noticed within about two seconds, so that run
	// learns its grant's state soon after a partition heals.
	if hc, err := lock.ConfigureTransport(cfg); err == nil {
		cfg = hc
	}
	// Admission warnings (a request ID reused after its window, a forced
	// release) go to stderr, as kubectl prints them; those of a create that
	// made nothing are dropped.
	cfg.WarningHandler = rest.NewWarningWriter(a.streams.ErrOut, rest.WarningWriterOptions{Deduplicate: true})
	withoutFailedCreateWarnings(cfg)
	return cfg, nil
}

// client returns a direct client for the cluster the kubectl flags select.
func (a *app) client() (client.WithWatch, error) {
	cfg, err := a.restConfig()
	if err != nil {
		return nil, err
	}
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := lockingv1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: s})
}

// namespace is --namespace, or the kubeconfig context's namespace.
func (a *app) namespace() (string, error) {
	ns, _, err := a.flags.ToRawKubeConfigLoader().Namespace()
	return ns, err
}

// locks returns the lock client in the selected namespace.
func (a *app) locks() (*lock.Client, client.WithWatch, string, error) {
	c, err := a.client()
	if err != nil {
		return nil, nil, "", err
	}
	ns, err := a.namespace()
	if err != nil {
		return nil, nil, "", err
	}
	return lock.NewClient(c, lock.WithNamespace(ns)), c, ns, nil
}

// grantKey parses GRANT as NAME or NAMESPACE/NAME.
func grantKey(arg, ns string) types.NamespacedName {
	if n, name, ok := strings.Cut(arg, "/"); ok {
		return types.NamespacedName{Namespace: n, Name: name}
	}
	return types.NamespacedName{Namespace: ns, Name: arg}
}

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// isTerminal reports whether f is a terminal.
func isTerminal(f any) bool {
	file, ok := f.(*os.File)
	return ok && term.IsTerminal(int(file.Fd()))
}

// completeGrants completes grant names in the selected namespace.
func (a *app) completeGrants(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	list, err := a.listGrants(false)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var names []string
	for _, g := range list {
		if !g.Status.Phase.Final() {
			names = append(names, g.Name+"\t"+g.Spec.Resource+" "+string(g.Status.Phase))
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

// completeResources completes the resource IDs of the namespace's grants.
func (a *app) completeResources(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveDefault
	}
	list, err := a.listGrants(false)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	seen := map[string]bool{}
	var ids []string
	for _, g := range list {
		if !seen[g.Spec.Resource] {
			seen[g.Spec.Resource] = true
			ids = append(ids, g.Spec.Resource)
		}
	}
	return ids, cobra.ShellCompDirectiveNoFileComp
}

// listGrants lists the grants of the selected namespace, or of all.
func (a *app) listGrants(all bool, opts ...client.ListOption) ([]lockingv1alpha1.LockGrant, error) {
	c, err := a.client()
	if err != nil {
		return nil, err
	}
	if !all {
		ns, err := a.namespace()
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.InNamespace(ns))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var list lockingv1alpha1.LockGrantList
	if err := c.List(ctx, &list, opts...); err != nil {
		return nil, err
	}
	return list.Items, nil
}
