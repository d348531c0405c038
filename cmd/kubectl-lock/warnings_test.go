package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
)

// An admission warning is printed with the object it speaks of: not for a
// create the API server refused after admission (AlreadyExists when the
// grant of the request ID exists, a denial), whose object was never made.
// Other requests' warnings are printed as kubectl prints them.
func TestWarningsOfRefusedCreatesAreNotPrinted(t *testing.T) {
	const warning = `request ID "nightly" was spent by an earlier grant (ended 2026-12-01T00:00:00Z) whose window has passed: this request runs as a new attempt`
	for _, tc := range []struct {
		name   string
		update bool
		status int
		reason metav1.StatusReason
		want   bool
	}{
		{name: "create made the object", status: http.StatusCreated, want: true},
		{name: "create found it existed", status: http.StatusConflict, reason: metav1.StatusReasonAlreadyExists},
		{name: "create was denied", status: http.StatusForbidden, reason: metav1.StatusReasonForbidden},
		{name: "update was refused", update: true, status: http.StatusConflict, reason: metav1.StatusReasonConflict, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Add("Warning", `299 - "`+strings.ReplaceAll(warning, `"`, `\"`)+`"`)
				w.WriteHeader(tc.status)
				if tc.status < 300 {
					_, _ = w.Write(body)
					return
				}
				_ = json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
					Status: metav1.StatusFailure, Reason: tc.reason, Code: int32(tc.status), Message: string(tc.reason)})
			}))
			defer srv.Close()
			var errOut bytes.Buffer
			a := &app{streams: genericiooptions.IOStreams{Out: io.Discard, ErrOut: &errOut}, flags: testFlags(t, srv.URL)}
			cfg, err := a.restConfig()
			if err != nil {
				t.Fatal(err)
			}
			cfg.ContentType = "application/json"
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "x"}}
			if tc.update {
				_, err = cs.CoreV1().ConfigMaps("ns").Update(t.Context(), cm, metav1.UpdateOptions{})
			} else {
				_, err = cs.CoreV1().ConfigMaps("ns").Create(t.Context(), cm, metav1.CreateOptions{})
			}
			if (err == nil) != (tc.status < 300) {
				t.Fatalf("request answered %d returned %v", tc.status, err)
			}
			if got := strings.Contains(errOut.String(), "Warning: "+warning); got != tc.want {
				t.Errorf("warning printed: %v, want %v; stderr: %q", got, tc.want, errOut.String())
			}
		})
	}
}

// testFlags are kubectl flags that select the API server at url.
func testFlags(t *testing.T, url string) *genericclioptions.ConfigFlags {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := genericclioptions.NewConfigFlags(false)
	f.KubeConfig, f.APIServer = &kubeconfig, &url
	return f
}
