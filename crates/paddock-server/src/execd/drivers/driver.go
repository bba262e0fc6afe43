// Paddock's Go code-interpreter driver: one per context, built in the sandbox with its own
// `go` at the context's start. Requests are JSON lines on stdin ({"code": ...}); replies are
// marker lines, MARK + JSON, on the same streams as the cell's output, after it.
//
// Go has no REPL, so a cell is a program:
//   - a cell that starts with `package` is a whole program, run as it is, keeping nothing;
//   - any other cell is split into top-level declarations (import, func, type, var, const),
//     which the context keeps, and statements, which run once in main (a cell may declare its
//     own func main instead, which runs once and is not kept). Each cell's program is
//     the kept declarations, its own, and its statements: functions and types stay defined,
//     and package variables too, though their initializers run again with every cell (their
//     values are not carried from one cell's process to the next). Imports no cell uses any
//     more are dropped when the compiler names them.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

var mark = "\x1ePADDOCK-" + os.Getenv("PADDOCK_CODE_NONCE") + " "

func reply(to *os.File, v any) {
	b, _ := json.Marshal(v)
	to.WriteString(mark + string(b) + "\n")
}

func errorReply(name, value string, traceback []string) map[string]any {
	if traceback == nil {
		traceback = []string{}
	}
	return map[string]any{"t": "error", "ename": name, "evalue": value, "traceback": traceback}
}

// The kept part of the context.
var (
	imports []string // import specs: `"fmt"`, `str "strings"`
	decls   []string
)

var unusedImport = regexp.MustCompile(`"([^"]+)" imported (as \w+ )?and not used`)

// split separates a cell's top-level declarations from its statements, by lines: a
// declaration starts at brace depth 0 with a declaration keyword and ends where its braces and
// parentheses close.
func split(code string) (imps, ds []string, stmts string) {
	var body []string
	lines := strings.Split(code, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		t := strings.TrimSpace(line)
		kw := strings.SplitN(strings.SplitN(t, " ", 2)[0], "(", 2)[0]
		// Only unindented lines start declarations; `func(` begins a literal, a statement.
		declaration := line == t && !strings.HasPrefix(t, "func(") &&
			(kw == "import" || kw == "func" || kw == "type" || kw == "var" || kw == "const")
		if declaration {
			chunk := []string{line}
			depth := strings.Count(line, "{") + strings.Count(line, "(") - strings.Count(line, "}") - strings.Count(line, ")")
			for depth > 0 && i+1 < len(lines) {
				i++
				chunk = append(chunk, lines[i])
				depth += strings.Count(lines[i], "{") + strings.Count(lines[i], "(") - strings.Count(lines[i], "}") - strings.Count(lines[i], ")")
			}
			text := strings.Join(chunk, "\n")
			if strings.HasPrefix(kw, "import") {
				rest := strings.TrimSpace(strings.TrimPrefix(text, "import"))
				rest = strings.TrimSuffix(strings.TrimPrefix(rest, "("), ")")
				for _, spec := range strings.Split(rest, "\n") {
					if s := strings.TrimSpace(spec); s != "" {
						imps = append(imps, s)
					}
				}
				continue
			}
			ds = append(ds, text)
			continue
		}
		body = append(body, line)
	}
	return imps, ds, strings.Join(body, "\n")
}

// program is the kept and the cell's declarations, and a main of the cell's statements, unless
// the cell declares its own main.
func program(imps, ds []string, stmts string) string {
	var b strings.Builder
	b.WriteString("package main\n\n")
	for _, i := range imps {
		b.WriteString("import " + i + "\n")
	}
	ownMain := false
	for _, d := range ds {
		b.WriteString("\n" + d + "\n")
		ownMain = ownMain || isMain(d)
	}
	if !ownMain || strings.TrimSpace(stmts) != "" {
		b.WriteString("\nfunc main() {\n" + stmts + "\n}\n")
	}
	return b.String()
}

// isMain says whether a declaration is a `func main`, which runs once and is never kept.
func isMain(d string) bool {
	rest := strings.TrimSpace(strings.TrimPrefix(d, "func"))
	return strings.HasPrefix(d, "func") && strings.HasPrefix(rest, "main(")
}

func without(list []string, drop string) []string {
	var out []string
	for _, s := range list {
		if s != drop {
			out = append(out, s)
		}
	}
	return out
}

// build compiles src in dir; the compiler's complaint when it fails.
func build(dir, src string) (string, bool) {
	os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o600)
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "cell"), filepath.Join(dir, "main.go"))
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

func compileError(out string) map[string]any {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" && !strings.HasPrefix(l, "# ") {
			lines = append(lines, l)
		}
	}
	value := "the cell does not compile"
	if len(lines) > 0 {
		value = lines[0]
		if parts := strings.SplitN(value, ": ", 2); len(parts) == 2 && strings.Contains(parts[0], ".go:") {
			value = parts[1]
		}
	}
	return errorReply("CompilationError", value, lines)
}

// runInFreshDir builds and runs a cell in a directory of its own, removed after it: a
// context killed between cells leaves nothing in /tmp.
func runInFreshDir(code string) map[string]any {
	dir, err := os.MkdirTemp("", "paddock-go-")
	if err != nil {
		return errorReply("OSError", "cannot make a directory for the cell: "+err.Error(), nil)
	}
	defer os.RemoveAll(dir)
	return run(dir, code)
}

func run(dir, code string) map[string]any {
	whole := strings.HasPrefix(strings.TrimSpace(code), "package ")
	var imps, ds []string
	var src string
	if whole {
		src = code
	} else {
		var stmts string
		imps, ds, stmts = split(code)
		var all []string
		seen := map[string]bool{}
		for _, i := range append(append([]string{}, imports...), imps...) {
			if !seen[i] {
				seen[i] = true
				all = append(all, i)
			}
		}
		uniq := append([]string{}, all...)
		allDecls := append(append([]string{}, decls...), ds...)
		for tries := 0; ; tries++ {
			src = program(uniq, allDecls, stmts)
			out, ok := build(dir, src)
			if ok {
				break
			}
			m := unusedImport.FindStringSubmatch(out)
			if m == nil || tries > 32 {
				return compileError(out)
			}
			// Unused in this cell's program only: a later cell may use it.
			path := m[1]
			before := len(uniq)
			for _, i := range uniq {
				if strings.HasSuffix(i, "\""+path+"\"") {
					uniq = without(uniq, i)
				}
			}
			if len(uniq) == before {
				return compileError(out)
			}
		}
		// Declarations and imports are kept only once their cell compiled; a main never is.
		imports = all
		decls = decls[:0:0]
		for _, d := range allDecls {
			if !isMain(d) {
				decls = append(decls, d)
			}
		}
	}
	if whole {
		if out, ok := build(dir, src); !ok {
			return compileError(out)
		}
	}
	cmd := exec.Command(filepath.Join(dir, "cell"))
	cmd.Stdin = nil
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	err := cmd.Run()
	if err == nil {
		return nil
	}
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return errorReply("Interrupted", fmt.Sprintf("the cell ended by signal %d (%s)", int(ws.Signal()), ws.Signal()), nil)
		}
		return errorReply("ExitError", ee.Error(), nil)
	}
	return errorReply("ExecError", err.Error(), nil)
}

func main() {
	os.Unsetenv("PADDOCK_CODE_NONCE")
	// An interrupt (SIGINT to the process group) ends the running cell, not the context: a
	// handler, not an ignore, so the cells' programs still get the default action.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, os.Interrupt)
	go func() {
		for range sigs {
		}
	}()
	// The launcher's build directory (this binary, a few MB): not needed once running, and
	// a context is ended by SIGKILL, so it is removed now or never.
	if len(os.Args) > 1 {
		os.RemoveAll(os.Args[1])
	}
	reply(os.Stdout, map[string]string{"t": "ready"})
	reply(os.Stderr, map[string]string{"t": "ready"})
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadString('\n')
		if strings.TrimSpace(line) != "" {
			var req struct {
				Code string `json:"code"`
			}
			var r map[string]any
			if jerr := json.Unmarshal([]byte(line), &req); jerr != nil {
				r = errorReply("ProtocolError", jerr.Error(), nil)
			} else {
				r = runInFreshDir(req.Code)
			}
			if r != nil {
				reply(os.Stdout, r)
			}
			reply(os.Stdout, map[string]string{"t": "done"})
			reply(os.Stderr, map[string]string{"t": "done"})
		}
		if err != nil {
			return
		}
	}
}
