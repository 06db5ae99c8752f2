// Package docs holds the test that every relative link in README.md and
// docs/ resolves: to a file of the repository and, with a #fragment, to
// one of its headings.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the repository, from this package's directory.
const root = "../.."

var (
	// link is a Markdown link or image: [text](target).
	link = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// heading is a Markdown heading line.
	heading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*$`)
	// fence opens or closes a code block, whose lines are not Markdown.
	fence = regexp.MustCompile("(?m)^\\s*```")
)

// slug is GitHub's anchor for a heading: lower case, punctuation but
// hyphens dropped, spaces turned to hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// prose is text with its code blocks blanked out.
func prose(text string) string {
	parts := fence.Split(text, -1)
	for i := 1; i < len(parts); i += 2 {
		parts[i] = ""
	}
	return strings.Join(parts, "\n")
}

// anchors returns the anchors of the headings of the Markdown file path.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(prose(string(b)), -1) {
		s := strings.NewReplacer("`", "", "*", "").Replace(m[1])
		a := slug(s)
		for n := 1; out[a]; n++ { // GitHub numbers repeated headings
			a = slug(s) + "-" + string(rune('0'+n))
		}
		out[a] = true
	}
	return out
}

func TestRelativeLinksResolve(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(prose(string(b)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %q: %v", rel(f), target, err)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !anchors(t, dest)[frag] {
				t.Errorf("%s: link %q: %s has no heading with that anchor", rel(f), target, rel(dest))
			}
			checked++
		}
	}
	if checked < 10 {
		t.Fatalf("only %d links checked: is the pattern right?", checked)
	}
}

func rel(p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return r
}
