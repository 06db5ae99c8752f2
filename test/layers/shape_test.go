package layers

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// Bounds that keep code readable in parts: a function of pkg/ or cmd/
// fits on a screen or two, a file of pkg/ holds one concern.
const (
	maxFuncLines    = 80
	maxPkgFileLines = 450
)

func TestShape(t *testing.T) {
	fset := token.NewFileSet()
	for _, root := range []string{"pkg", "cmd"} {
		err := filepath.WalkDir(filepath.Join("../..", root), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			rel := strings.TrimPrefix(path, "../../")
			if n := fset.File(f.Pos()).LineCount(); root == "pkg" && n > maxPkgFileLines {
				t.Errorf("%s: %d lines, more than %d: split it by concern", rel, n, maxPkgFileLines)
			}
			for _, decl := range f.Decls {
				if fd, ok := decl.(*ast.FuncDecl); ok && fd.Body != nil {
					if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
						t.Errorf("%s: %s is %d lines, more than %d", rel, fd.Name.Name, n, maxFuncLines)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
