package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// code is an inline code span.
	code = regexp.MustCompile("`([^`\n]+)`")
	// repoPath is a path of the repository, as docs name files and
	// directories: it starts with one of its top-level directories.
	repoPath = regexp.MustCompile(`^(pkg|cmd|internal|test|e2e|examples|hack|docs|deploy|\.ci)/[\w./-]*$`)
	// qualified is pkg.Name, pkg.Type.Member or Type.Member, with an
	// optional call's parentheses.
	qualified = regexp.MustCompile(`^([a-z][a-z0-9]*\.)?([A-Z]\w*)(\.(\w+))?(\(\))?$`)
	// goFile is a Go file's base name, and ident a Go identifier.
	goFile = regexp.MustCompile(`^\w+\.go$`)
	ident  = regexp.MustCompile(`^[A-Za-z_]\w*$`)
)

// goNames are the names the repository's Go code declares.
type goNames struct {
	// exported holds each package name's exported top-level names (the
	// packages of one name, such as the binaries' app, together).
	exported map[string]map[string]bool
	// members holds each type name's methods and fields, the types of
	// one name in any package together.
	members map[string]map[string]bool
	// inFile holds what the files of each base name declare at top
	// level, functions and methods by their own name.
	inFile map[string]map[string]bool
}

func add(m map[string]map[string]bool, k, v string) {
	if m[k] == nil {
		m[k] = map[string]bool{}
	}
	m[k][v] = true
}

// declared parses every Go file of the repository, tests included.
func declared(t *testing.T) goNames {
	t.Helper()
	n := goNames{exported: map[string]map[string]bool{}, members: map[string]map[string]bool{}, inFile: map[string]map[string]bool{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "vendor" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && path != root) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg, base := f.Name.Name, filepath.Base(path)
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				add(n.inFile, base, d.Name.Name)
				if d.Recv == nil {
					add(n.exported, pkg, d.Name.Name)
					continue
				}
				if typ := receiverType(d.Recv.List[0].Type); typ != "" {
					add(n.members, typ, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						add(n.exported, pkg, s.Name.Name)
						add(n.inFile, base, s.Name.Name)
						addMembers(n, s)
					case *ast.ValueSpec:
						for _, id := range s.Names {
							add(n.exported, pkg, id.Name)
							add(n.inFile, base, id.Name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// receiverType is the name of a method's receiver type.
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// addMembers records the fields of a struct type and the methods of an
// interface type.
func addMembers(n goNames, s *ast.TypeSpec) {
	var fields *ast.FieldList
	switch t := s.Type.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	default:
		return
	}
	for _, f := range fields.List {
		for _, id := range f.Names {
			add(n.members, s.Name.Name, id.Name)
		}
		if len(f.Names) == 0 { // embedded: its name is the type's
			if name := receiverType(f.Type); name != "" {
				add(n.members, s.Name.Name, name)
			} else if sel, ok := f.Type.(*ast.SelectorExpr); ok {
				add(n.members, s.Name.Name, sel.Sel.Name)
			}
		}
	}
}

// Every code reference in README.md and docs/ exists: a path of the
// repository (`pkg/server/dials.go`, `test/churn/`), a Go name of ours
// written as pkg.Name, pkg.Type.Member or Type.Member, and a name right
// after a Go file's base name (`dials.go` `startDial`) in a file of
// that name. A name
// qualified by a package or type that is not ours (`net.Dialer`) is not
// checked, nor a bare identifier, which prose cannot tell from a word.
// CHANGELOG.md is history, and names what was removed.
func TestCodeReferencesExist(t *testing.T) {
	names := declared(t)
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	paths, idents := 0, 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := prose(string(b))
		spans := code.FindAllStringSubmatchIndex(text, -1)
		for i, m := range spans {
			ref := text[m[2]:m[3]]
			// "`dials.go` `startDial`": the name is declared in a file
			// of that name.
			if goFile.MatchString(ref) && i+1 < len(spans) && strings.TrimSpace(text[m[1]:spans[i+1][0]]) == "" {
				idents++
				if name := text[spans[i+1][2]:spans[i+1][3]]; ident.MatchString(name) && !names.inFile[ref][name] {
					t.Errorf("%s: `%s` `%s`: no file of that name declares it", rel(f), ref, name)
				}
			}
			switch {
			case repoPath.MatchString(ref):
				if strings.ContainsAny(ref, "*<") || strings.HasSuffix(ref, "/...") {
					continue // a pattern, not a path
				}
				paths++
				if _, err := os.Stat(filepath.Join(root, ref)); err != nil {
					t.Errorf("%s: `%s` does not exist", rel(f), ref)
				}
			case qualified.MatchString(ref):
				idents++
				if problem := names.check(qualified.FindStringSubmatch(ref)); problem != "" {
					t.Errorf("%s: `%s`: %s", rel(f), ref, problem)
				}
			}
		}
	}
	t.Logf("checked %d paths and %d qualified names", paths, idents)
	if paths < 50 || idents < 20 {
		t.Fatalf("only %d paths and %d names checked: are the patterns right?", paths, idents)
	}
}

// check says what is wrong with a reference that qualified matched, or
// "" when it exists or is not ours to check.
func (n goNames) check(m []string) string {
	pkg, name, member := strings.TrimSuffix(m[1], "."), m[2], m[4]
	if pkg != "" {
		exported, ours := n.exported[pkg]
		if !ours {
			return ""
		}
		if !exported[name] {
			return "package " + pkg + " declares no " + name
		}
		if member != "" && !n.members[name][member] {
			return name + " has no method or field " + member
		}
		return ""
	}
	members, ours := n.members[name]
	if !ours || member == "" {
		return ""
	}
	if !members[member] {
		return name + " has no method or field " + member
	}
	return ""
}
