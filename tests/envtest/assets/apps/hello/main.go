// hello is the application the tests and the demo run on the real node. It answers, on
// every TCP port named in $HELLO_PORTS (default 8080):
//
//	GET /        {"version", "pod", "namespace", "uid", "gid", "readOnlyRoot", "capEff",
//	             "noNewPrivs", "seccomp"}: which image (its $APP_VERSION, set in the image
//	             config) and which Pod answered, and what the process runs with (the last
//	             three as /proc/self/status says them).
//	GET /healthz 200.
//	GET /db      whether it reaches its database using only what the Pod gives it, as an
//	             application would: $DATABASE_URL when set, else libpq's PG* variables
//	             (PGSSLROOTCERT naming the mounted CA). 200 with {"ok": true, "tls": …,
//	             "user": …} when a query ran, 503 with {"ok": false, "error": …} when not.
//	GET /config  {"pod", "env", "files"}: the configuration the process read, every
//	             variable named CFG_* and every file of $HELLO_CONFIG_DIR by name.
//	GET /burn    keeps a CPU busy for ?ms= milliseconds (default 100, at most 1000),
//	             then answers {"pod", "ms"}: load for an autoscaler.
//
// On SIGTERM it keeps serving for 10 s (what a preStop sleep usually gives), and then as
// long as requests still come (until 3 s pass without one), then stops accepting and
// exits, as an application that drains does: nothing tells a Pod when every node's
// kube-proxy has taken it out of its Service, and on a busy machine that took longer than
// 10 s; requests stop coming then. It waits at most $HELLO_DRAIN (default 25s, inside the
// Pod's 30 s grace period). $HELLO_LISTEN_AFTER (a Go duration) delays listening, and HELLO_LISTEN=never never
// listens, so that tests can watch readiness gate a Service's endpoints.
//
// `hello get URL` is a client instead (for `kubectl exec`): it prints the answer's
// status line and body, and exits 1 when there is none.
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

type answer struct {
	Version      string `json:"version"`
	Pod          string `json:"pod"`
	Namespace    string `json:"namespace,omitempty"`
	UID          int    `json:"uid"`
	GID          int    `json:"gid"`
	ReadOnlyRoot bool   `json:"readOnlyRoot"`
	CapEff       string `json:"capEff"`
	NoNewPrivs   string `json:"noNewPrivs"`
	Seccomp      string `json:"seccomp"`
}

// procStatus reads the fields of /proc/self/status the answer reports.
func procStatus() map[string]string {
	fields := map[string]string{}
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fields
	}
	for _, line := range strings.Split(string(data), "\n") {
		name, value, ok := strings.Cut(line, ":")
		if ok {
			fields[name] = strings.TrimSpace(value)
		}
	}
	return fields
}

type dbAnswer struct {
	OK     bool   `json:"ok"`
	Via    string `json:"via"`
	TLS    bool   `json:"tls"`
	User   string `json:"user,omitempty"`
	Server string `json:"server,omitempty"`
	Error  string `json:"error,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func readOnlyRoot() bool {
	f, err := os.CreateTemp("/", ".hello-probe-")
	if err != nil {
		return true
	}
	name := f.Name()
	_ = f.Close()
	_ = os.Remove(name)
	return false
}

func pod() string {
	if p := os.Getenv("POD_NAME"); p != "" {
		return p
	}
	h, _ := os.Hostname()
	return h
}

func root(w http.ResponseWriter, _ *http.Request) {
	proc := procStatus()
	writeJSON(w, http.StatusOK, answer{
		CapEff:       proc["CapEff"],
		NoNewPrivs:   proc["NoNewPrivs"],
		Seccomp:      proc["Seccomp"],
		Version:      os.Getenv("APP_VERSION"),
		Pod:          pod(),
		Namespace:    os.Getenv("POD_NAMESPACE"),
		UID:          os.Getuid(),
		GID:          os.Getgid(),
		ReadOnlyRoot: readOnlyRoot(),
	})
}

func database(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	url, via := os.Getenv("DATABASE_URL"), "DATABASE_URL"
	if url == "" {
		via = "PG* variables"
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, dbAnswer{Via: via, Error: err.Error()})
		return
	}
	defer conn.Close(context.Background())
	var user, server string
	if err := conn.QueryRow(ctx, "select current_user, current_setting('server_version')").Scan(&user, &server); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, dbAnswer{Via: via, Error: err.Error()})
		return
	}
	_, encrypted := conn.PgConn().Conn().(*tls.Conn)
	writeJSON(w, http.StatusOK, dbAnswer{OK: true, Via: via, TLS: encrypted, User: user, Server: server})
}

// config answers with the configuration the process read: every environment variable
// whose name starts with CFG_, and every file of the directory HELLO_CONFIG_DIR names
// (the keys of a mounted ConfigMap or Secret; the kubelet's own ".." entries skipped).
func config(w http.ResponseWriter, _ *http.Request) {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "CFG_") {
			env[k] = v
		}
	}
	files := map[string]string{}
	if dir := os.Getenv("HELLO_CONFIG_DIR"); dir != "" {
		entries, err := os.ReadDir(dir)
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
			return
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "..") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
				return
			}
			files[e.Name()] = string(b)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"pod": pod(), "env": env, "files": files})
}

// burn keeps a CPU busy for ?ms= milliseconds (at most 1000, default 100) before it
// answers: the load an autoscaler is tested with.
func burn(w http.ResponseWriter, r *http.Request) {
	ms, err := strconv.Atoi(r.URL.Query().Get("ms"))
	if err != nil || ms <= 0 {
		ms = 100
	}
	ms = min(ms, 1000)
	until := time.Now().Add(time.Duration(ms) * time.Millisecond)
	sum := sha256.Sum256([]byte(pod()))
	for time.Now().Before(until) {
		for range 1000 {
			sum = sha256.Sum256(sum[:])
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"pod": pod(), "ms": ms, "sum": fmt.Sprintf("%x", sum[:4])})
}

func get(url string) {
	client := &http.Client{Timeout: 10 * time.Second}
	res, err := client.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer res.Body.Close()
	fmt.Println(res.Status)
	_, _ = io.Copy(os.Stdout, io.LimitReader(res.Body, 1<<20))
}

func main() {
	log.SetFlags(log.LstdFlags | log.LUTC)
	if len(os.Args) == 3 && os.Args[1] == "get" {
		get(os.Args[2])
		return
	}
	ports := strings.Fields(strings.ReplaceAll(os.Getenv("HELLO_PORTS"), ",", " "))
	if len(ports) == 0 {
		ports = []string{"8080"}
	}
	if os.Getenv("HELLO_LISTEN") == "never" {
		log.Printf("hello %s: HELLO_LISTEN=never, not listening", os.Getenv("APP_VERSION"))
		select {}
	}
	if d := os.Getenv("HELLO_LISTEN_AFTER"); d != "" {
		wait, err := time.ParseDuration(d)
		if err != nil {
			log.Fatalf("HELLO_LISTEN_AFTER=%q is not a duration: %v", d, err)
		}
		time.Sleep(wait)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", root)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /db", database)
	mux.HandleFunc("GET /config", config)
	mux.HandleFunc("GET /burn", burn)
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		last.Store(time.Now().UnixNano())
		mux.ServeHTTP(w, r)
	})
	drain := 25 * time.Second
	if d := os.Getenv("HELLO_DRAIN"); d != "" {
		wait, err := time.ParseDuration(d)
		if err != nil {
			log.Fatalf("HELLO_DRAIN=%q is not a duration: %v", d, err)
		}
		drain = wait
	}
	errs := make(chan error, len(ports))
	servers := make([]*http.Server, 0, len(ports))
	for _, port := range ports {
		server := &http.Server{Addr: ":" + port, Handler: handler, ReadHeaderTimeout: 5 * time.Second}
		servers = append(servers, server)
		go func() { errs <- server.ListenAndServe() }()
	}
	log.Printf("hello %s (uid %d) listening on %v", os.Getenv("APP_VERSION"), syscall.Getuid(), ports)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-errs:
		log.Fatal(err)
	case <-term:
	}
	const least, quiet = 10 * time.Second, 3 * time.Second
	log.Printf("terminating: serving %s, then until %s without a request (at most %s), then closing", least, quiet, drain)
	start := time.Now()
	for time.Since(start) < drain &&
		(time.Since(start) < least || time.Since(time.Unix(0, last.Load())) < quiet) {
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, server := range servers {
		_ = server.Shutdown(ctx)
	}
}
