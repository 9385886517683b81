package archtest

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// row is one line of the layering table.
type row struct {
	line     int
	pkgs     []string // module-relative paths
	imports  []string // module-relative paths it may import
	any      bool     // "all of the above"
	testOnly bool     // "(tests only)", "(benchmarks only)", "(tests and benchmarks only)"
}

var quoted = regexp.MustCompile("`([^`]+)`")

// readTable parses the first Markdown table of ARCHITECTURE.md whose header
// starts with "| package |".
func readTable(t *testing.T, path string) []row {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []row
	in := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if !in {
			in = strings.HasPrefix(line, "| package |")
			continue
		}
		if strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 {
			t.Fatalf("%s:%d: a row of the layering table needs 3 cells: %q", path, n, line)
		}
		r := row{line: n}
		first, last := cells[0], cells[len(cells)-1]
		for _, m := range quoted.FindAllStringSubmatch(first, -1) {
			r.pkgs = append(r.pkgs, m[1])
		}
		r.testOnly = strings.Contains(first, "only)")
		r.any = strings.Contains(last, "all of the above")
		for _, m := range quoted.FindAllStringSubmatch(last, -1) {
			r.imports = append(r.imports, m[1])
		}
		if len(r.pkgs) == 0 {
			t.Errorf("%s:%d: the row names no package", path, n)
		}
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no layering table (a table whose header starts with \"| package |\")", path)
	}
	return rows
}

type goPackage struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
}

func goList(t *testing.T, root string, args ...string) []goPackage {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("the go command is not in PATH")
	}
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list %v: %v\n%s", args, err, msg)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestLayering(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	doc := filepath.Join(root, "docs", "ARCHITECTURE.md")
	rows := readTable(t, doc)
	const module = "github.com/zodbd/zodbd"
	rel := func(p string) (string, bool) {
		if p == module {
			return ".", true
		}
		if s, ok := strings.CutPrefix(p, module+"/"); ok {
			return s, true
		}
		return "", false
	}

	rowOf := map[string]int{} // package -> index in rows
	for i, r := range rows {
		for _, p := range r.pkgs {
			if j, dup := rowOf[p]; dup {
				t.Errorf("%s:%d: %s already has a row (line %d)", doc, r.line, p, rows[j].line)
			}
			rowOf[p] = i
		}
	}

	listed := map[string]bool{}
	for _, p := range goList(t, root, "./...") {
		name, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		listed[name] = true
		// Stat the package's files: go test's cache then knows that this
		// test's result depends on them (it cannot see what go list read).
		for _, f := range p.GoFiles {
			os.Stat(filepath.Join(p.Dir, f))
		}
		i, ok := rowOf[name]
		if !ok {
			t.Errorf("%s: package %s has no row in the layering table", doc, name)
			continue
		}
		r := rows[i]
		allowed := map[string]bool{}
		for _, q := range r.imports {
			allowed[q] = true
		}
		for _, imp := range p.Imports {
			q, ok := rel(imp)
			if !ok {
				continue
			}
			j, known := rowOf[q]
			switch {
			case protocol(name) != "" && protocol(q) != "" && protocol(name) != protocol(q):
				t.Errorf("%s imports %s: a protocol package never imports the other protocol's", name, q)
			case !known:
				t.Errorf("%s imports %s, which has no row in %s", name, q, doc)
			case j >= i && rows[j].line != r.line:
				t.Errorf("%s:%d: %s imports %s, which comes later in the table (line %d): the layering is one-way",
					doc, r.line, name, q, rows[j].line)
			case !r.any && !allowed[q]:
				t.Errorf("%s:%d: %s imports %s, which its row does not list", doc, r.line, name, q)
			}
		}
	}
	for p, i := range rowOf {
		if !listed[p] {
			t.Errorf("%s:%d: the table names %s, which is not a package of the module", doc, rows[i].line, p)
		}
	}

	// The release binary links no test tooling.
	for _, p := range goList(t, root, "./cmd/zodbd") {
		for _, d := range append(p.Deps, p.ImportPath) {
			q, ok := rel(d)
			if !ok {
				continue
			}
			if i, ok := rowOf[q]; ok && rows[i].testOnly {
				t.Errorf("the release binary (cmd/zodbd) links %s, whose row (line %d) says it is only for tests or benchmarks",
					q, rows[i].line)
			}
		}
	}
}

// protocol names the protocol a package speaks: "zeo" for zeo and
// zeo/..., "neo" for neo/...; "" for the others (neosqlite is an engine).
func protocol(p string) string {
	switch {
	case p == "zeo" || strings.HasPrefix(p, "zeo/"):
		return "zeo"
	case strings.HasPrefix(p, "neo/"):
		return "neo"
	}
	return ""
}
