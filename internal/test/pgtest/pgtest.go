// Package pgtest runs a throwaway PostgreSQL server for tests, from the
// server binaries of the machine's PostgreSQL packages (Debian's
// "postgresql": /usr/lib/postgresql/VERSION/bin). No container, no download.
//
// A test package that needs PostgreSQL calls Main from its TestMain and
// Database from each test:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
//	func TestX(t *testing.T) {
//		dsn := pgtest.Database(t) // a fresh, empty database
//		...
//	}
//
// Main runs initdb into a temporary directory and starts postgres on a free
// loopback port with trust authentication, runs the tests, then stops the
// server and removes the directory. Run as root, the server runs as the
// "postgres" user (initdb and postgres refuse to run as root), and the
// directory is handed to that user.
//
// When no server binary can be found or started, Main prints a loud
// message and the tests that call Database skip, unless the environment
// variable CI or LOCKWARDEN_REQUIRE_POSTGRES is set, in which case Main
// fails: in CI a missing server is a broken set-up, not a reason to skip.
// PGBIN overrides where the binaries are looked for.
//
// Under go test -short (make test-unit) Main starts no server and runs the
// tests: those that call Database skip, saying so.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// Server is one running PostgreSQL server.
type Server struct {
	dir  string
	port int
	cmd  *exec.Cmd
	// exited is closed when the server process has exited.
	exited chan struct{}
	admin  *sql.DB

	mu sync.Mutex
	n  int
}

var (
	server *Server
	// unavailable says why there is no server, when there is none.
	unavailable error
	// short is set under -short, when Main starts no server.
	short bool
)

// Main starts the server, runs the tests and stops the server. It returns
// the exit code for os.Exit.
func Main(m *testing.M) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() {
		short = true
		return m.Run()
	}
	s, err := Start()
	if err != nil {
		msg := fmt.Sprintf("pgtest: NO POSTGRESQL SERVER: %v\n"+
			"pgtest: install Debian's package (apt-get install postgresql) or set PGBIN to the directory of initdb and postgres", err)
		line := strings.Repeat("!", 78)
		fmt.Fprintf(os.Stderr, "\n%s\n%s\n", line, msg)
		if required() {
			fmt.Fprintf(os.Stderr, "pgtest: FAILING, because CI or LOCKWARDEN_REQUIRE_POSTGRES is set\n%s\n\n", line)
			return 1
		}
		fmt.Fprintf(os.Stderr, "pgtest: SKIPPING every test that needs PostgreSQL\n%s\n\n", line)
		unavailable = err
		return m.Run()
	}
	server = s
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: stopping PostgreSQL: %v\n", err)
	}
	return code
}

func required() bool {
	return os.Getenv("CI") != "" || os.Getenv("LOCKWARDEN_REQUIRE_POSTGRES") != ""
}

// Database creates a fresh empty database on the server Main started and
// returns its DSN (a postgres:// URL for the pgx driver). It skips the test
// when no server could run, and fails it when the database cannot be made.
func Database(t testing.TB) string {
	t.Helper()
	if short {
		t.Skip("-short: it needs PostgreSQL; make test-envtest and make test run it")
	}
	if server == nil {
		if unavailable == nil {
			t.Fatal("pgtest: Database called without pgtest.Main in TestMain")
		}
		t.Skipf("pgtest: no PostgreSQL server: %v", unavailable)
	}
	dsn, err := server.CreateDatabase(t.Context())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsn
}

// Start initializes and starts a server. The error says why no server
// could run (no binaries, initdb or postgres failed).
func Start() (*Server, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "lockwarden-pgtest-")
	if err != nil {
		return nil, err
	}
	s, err := start(bin, dir, cred)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func start(bin, dir string, cred *syscall.Credential) (*Server, error) {
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := command(cred, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	var lastErr error
	for range 3 { // a free port can be taken between choosing and binding it
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s, err := launch(bin, dir, data, port, cred)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func launch(bin, dir, data string, port int, cred *syscall.Credential) (*Server, error) {
	logPath := filepath.Join(dir, "postgres.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := command(cred, filepath.Join(bin, "postgres"),
		"-D", data, "-p", strconv.Itoa(port), "-h", "127.0.0.1", "-k", dir,
		// A throwaway server: durability buys nothing here.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// If the test binary dies, the server stops with it (immediate shutdown).
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting postgres: %w", err)
	}
	s := &Server{dir: dir, port: port, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.exited) }()

	s.admin, err = sql.Open("pgx", s.DSN("postgres"))
	if err != nil {
		_ = s.Stop()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := s.admin.PingContext(ctx); err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			log, _ := os.ReadFile(logPath)
			_ = s.admin.Close()
			return nil, fmt.Errorf("postgres exited while starting:\n%s", log)
		case <-ctx.Done():
			_ = s.Stop()
			return nil, errors.New("postgres did not accept connections within 60s")
		case <-tick.C:
		}
	}
}

// DSN returns the URL of database db on the server.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// CreateDatabase creates a fresh empty database and returns its DSN.
func (s *Server) CreateDatabase(ctx context.Context) (string, error) {
	s.mu.Lock()
	s.n++
	name := fmt.Sprintf("t%d", s.n)
	s.mu.Unlock()
	if _, err := s.admin.ExecContext(ctx, "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	return s.DSN(name), nil
}

// Stop shuts the server down (fast shutdown, then a kill after 10 s) and
// removes its directory.
func (s *Server) Stop() error {
	if s.admin != nil {
		_ = s.admin.Close()
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	return os.RemoveAll(s.dir)
}

// findBin returns the directory holding initdb and postgres: $PGBIN, else
// the newest /usr/lib/postgresql/VERSION/bin, else the directory of
// initdb on $PATH.
func findBin() (string, error) {
	ok := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv("PGBIN"); dir != "" {
		if ok(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("PGBIN=%s has no initdb and postgres", dir)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if ok(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if target, err := filepath.EvalSymlinks(p); err == nil && ok(filepath.Dir(target)) {
			return filepath.Dir(target), nil
		}
	}
	return "", errors.New("no initdb and postgres in $PGBIN, /usr/lib/postgresql/*/bin or $PATH")
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// credential returns the user the server runs as: nil (the current user)
// unless we are root, then "postgres" (created by Debian's package), else
// "nobody".
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 == nil && err2 == nil && uid != 0 {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
		}
	}
	return nil, errors.New("running as root, and there is no postgres or nobody user to run the server as")
}

func command(cred *syscall.Credential, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	// The server must not inherit a root HOME or a working directory it
	// cannot read.
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
