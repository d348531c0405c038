//go:build tools

// Package tools pins etcd and etcdutl for the local control plane.
package tools

import (
	_ "go.etcd.io/etcd/etcdutl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
