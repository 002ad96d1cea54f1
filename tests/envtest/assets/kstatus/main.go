// Command kstatus computes the kstatus status of Kubernetes objects with
// sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute, as Flux's health checks, Helm's
// --wait and kubectl-style tools do.
//
// Usage: kstatus < objects.json, where the input is one JSON object or a JSON array of
// objects. Prints one JSON array of {"status":"...","message":"..."} on stdout, in order.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}

func run() error {
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	var objects []json.RawMessage
	if trimmed := bytes.TrimSpace(input); len(trimmed) > 0 && trimmed[0] == '[' {
		if err := json.Unmarshal(trimmed, &objects); err != nil {
			return fmt.Errorf("objects JSON: %w", err)
		}
	} else {
		objects = append(objects, trimmed)
	}
	results := make([]result, 0, len(objects))
	for i, raw := range objects {
		// Unstructured's own decoder: integers stay int64, as the API machinery reads them.
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(raw); err != nil {
			return fmt.Errorf("object %d JSON: %w", i, err)
		}
		res, err := status.Compute(obj)
		if err != nil {
			return fmt.Errorf("object %d: %w", i, err)
		}
		results = append(results, result{Status: res.Status.String(), Message: res.Message})
	}
	return json.NewEncoder(os.Stdout).Encode(results)
}
