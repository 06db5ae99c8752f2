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

// Bounds that keep what ships readable in parts: a function fits on a
// screen or two, a file holds one concern. What ships is pkg/, cmd/ and
// internal/ but its test kits (internal/*test).
const (
	maxFuncLines = 80
	maxFileLines = 450
)

func TestShape(t *testing.T) {
	fset := token.NewFileSet()
	for _, root := range []string{"pkg", "cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join("../..", root), func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && root == "internal" && strings.HasSuffix(d.Name(), "test") {
				return filepath.SkipDir // a test kit
			}
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			rel := strings.TrimPrefix(path, "../../")
			if n := fset.File(f.Pos()).LineCount(); n > maxFileLines {
				t.Errorf("%s: %d lines, more than %d: split it by concern", rel, n, maxFileLines)
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
