// Command argocd-health runs an Argo CD resource health script the way Argo CD does:
// with gopher-lua, the object as the global `obj`, the script's return value as the
// health (`hs.status`, `hs.message`). Argo CD's extra Lua libraries are not loaded.
//
// Usage: argocd-health <script.lua> < object.json
// Prints {"status":"...","message":"..."} on stdout.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	lua "github.com/yuin/gopher-lua"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "argocd-health:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: argocd-health <script.lua> < object.json")
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		return err
	}
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := json.Unmarshal(input, &obj); err != nil {
		return fmt.Errorf("object JSON: %w", err)
	}

	// As gitops-engine's lua VM: only the safe base libraries, no os/io.
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.StringLibName, lua.OpenString},
		{lua.MathLibName, lua.OpenMath},
	} {
		l.Push(l.NewFunction(lib.fn))
		l.Push(lua.LString(lib.name))
		l.Call(1, 0)
	}
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(string(script)); err != nil {
		return fmt.Errorf("script: %w", err)
	}
	ret := l.Get(-1)
	tbl, ok := ret.(*lua.LTable)
	if !ok {
		return fmt.Errorf("script returned %s, not a table", ret.Type())
	}
	out := map[string]string{
		"status":  lua.LVAsString(tbl.RawGetString("status")),
		"message": lua.LVAsString(tbl.RawGetString("message")),
	}
	switch out["status"] {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown":
	default:
		return fmt.Errorf("script returned status %q, not an Argo CD health status", out["status"])
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// toLua converts decoded JSON as Argo CD does (gopher-luar on the unstructured map):
// objects become tables, arrays 1-based tables, numbers numbers, null nil.
func toLua(l *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []any:
		t := l.NewTable()
		for _, e := range v {
			t.Append(toLua(l, e))
		}
		return t
	case map[string]any:
		t := l.NewTable()
		for k, e := range v {
			t.RawSetString(k, toLua(l, e))
		}
		return t
	default:
		return lua.LString(fmt.Sprint(v))
	}
}
