package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// etcdPrefix is where the etcd mutexes live, apart from the API server's
// keys (which are under /registry).
const etcdPrefix = "/lockwarden-bench/"

// etcdClient is a client of go.etcd.io/etcd/client/v3/concurrency's Mutex:
// one gRPC connection and one session (lease) per client, as a separate
// process would have.
type etcdClient struct {
	cli  *clientv3.Client
	sess *concurrency.Session
	// expiryTTL > 0: every acquisition is made on a fresh lease of that
	// many seconds that is never kept alive, so that the holder vanishes
	// when it does not release.
	expiryTTL int
}

func newEtcdClient(endpoint string, expiryTTL int) (*etcdClient, error) {
	cli, err := newEtcd(endpoint)
	if err != nil {
		return nil, err
	}
	e := &etcdClient{cli: cli, expiryTTL: expiryTTL}
	if expiryTTL == 0 {
		if e.sess, err = concurrency.NewSession(cli, concurrency.WithTTL(30)); err != nil {
			cli.Close()
			return nil, fmt.Errorf("etcd session: %w", err)
		}
	}
	return e, nil
}

func newEtcd(endpoint string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", endpoint, err)
	}
	return cli, nil
}

func (e *etcdClient) Close() {
	if e.sess != nil {
		_ = e.sess.Close()
	}
	_ = e.cli.Close()
}

// Request locks the mutex of resource in the background.
func (e *etcdClient) Request(ctx context.Context, resource string) (*ticket, error) {
	pfx := etcdPrefix + resource
	sess := e.sess
	var expiresAt time.Time
	if e.expiryTTL > 0 {
		resp, err := e.cli.Grant(ctx, int64(e.expiryTTL))
		if err != nil {
			return nil, fmt.Errorf("etcd lease: %w", err)
		}
		// The lease expires TTL after the leader granted it; the session's
		// first keep-alive, sent at once and stopped right after, moves
		// that by at most its round trip.
		expiresAt = time.Now().Add(time.Duration(resp.TTL) * time.Second)
		if sess, err = concurrency.NewSession(e.cli, concurrency.WithLease(resp.ID)); err != nil {
			return nil, fmt.Errorf("etcd session: %w", err)
		}
		sess.Orphan()
	}
	m := concurrency.NewMutex(sess, pfx)
	myKey := fmt.Sprintf("%s/%x", pfx, sess.Lease())
	t := newTicket()
	lockCtx, cancel := context.WithCancel(ctx)
	go func() {
		if err := m.Lock(lockCtx); err != nil {
			t.fail(fmt.Errorf("etcd mutex %s: %w", pfx, err))
			return
		}
		t.markHeld(time.Now(), 0)
	}()
	// Waiting in line: our key is in etcd (Lock then waits for the
	// deletion of the key before ours, watching from the revision it read).
	t.awaitQueued = func(ctx context.Context) error {
		for {
			resp, err := e.cli.Get(ctx, myKey, clientv3.WithCountOnly())
			if err != nil {
				return err
			}
			if resp.Count > 0 {
				return nil
			}
			select {
			case <-t.done:
				return t.err
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
	}
	t.release = func(ctx context.Context) error {
		defer cancel()
		return m.Unlock(ctx)
	}
	t.vanish = func(context.Context) (time.Time, error) {
		if e.expiryTTL == 0 {
			return time.Time{}, errors.New("only a client with an expiry TTL can vanish")
		}
		return expiresAt, nil
	}
	return t, nil
}
