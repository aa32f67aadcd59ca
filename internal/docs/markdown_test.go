package docs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// root is the repository root, seen from this package's directory.
const root = "../.."

// checkedFiles lists the Markdown files whose links are checked, relative to root: the README,
// deploy/README.md and everything under docs/.
func checkedFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "deploy/README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("docs/: %v", err)
	}
	sort.Strings(files[2:])
	return files
}

// doc is a Markdown file split into lines, each marked when it lies inside a fenced code block
// (fences included).
type doc struct {
	path  string // relative to root, with slashes
	lines []string
	code  []bool
}

func readDoc(t *testing.T, rel string) *doc {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return parseDoc(rel, string(data))
}

var fenceRE = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})")

func parseDoc(rel, text string) *doc {
	d := &doc{path: rel, lines: strings.Split(text, "\n")}
	d.code = make([]bool, len(d.lines))
	fence := ""
	for i, l := range d.lines {
		m := fenceRE.FindStringSubmatch(l)
		switch {
		case fence == "" && m != nil:
			fence = m[1]
			d.code[i] = true
		case fence != "":
			d.code[i] = true
			if m != nil && m[1][0] == fence[0] && len(m[1]) >= len(fence) && strings.TrimSpace(l[strings.Index(l, m[1])+len(m[1]):]) == "" {
				fence = ""
			}
		}
	}
	return d
}

var headingRE = regexp.MustCompile(`^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)

// heading is one ATX heading of a doc.
type heading struct {
	line   int // 1-based
	level  int
	text   string
	anchor string
}

// headings returns the doc's headings with the anchors GitHub gives them.
func (d *doc) headings() []heading {
	var out []heading
	seen := map[string]int{}
	for i, l := range d.lines {
		if d.code[i] {
			continue
		}
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		a := slug(m[2])
		if n := seen[a]; n > 0 {
			seen[a] = n + 1
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		out = append(out, heading{line: i + 1, level: len(m[1]), text: m[2], anchor: a})
	}
	return out
}

var (
	inlineLinkRE = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)`)
	htmlTagRE    = regexp.MustCompile(`<[^>]+>`)
	codeSpanRE   = regexp.MustCompile("`+([^`]*)`+")
)

// slug is the anchor GitHub gives a heading: its rendered text in lower case, with everything
// but letters, digits, spaces, hyphens and underscores removed and each space a hyphen.
// (GitHub adds -1, -2, ... to repeated anchors; headings does that.)
func slug(text string) string {
	text = inlineLinkRE.ReplaceAllString(text, "$1")
	text = codeSpanRE.ReplaceAllString(text, "$1")
	text = htmlTagRE.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns every anchor of the doc: its headings', and explicit <a name|id="...">.
func (d *doc) anchors() map[string]bool {
	out := map[string]bool{}
	for _, h := range d.headings() {
		out[h.anchor] = true
	}
	for i, l := range d.lines {
		if d.code[i] {
			continue
		}
		for _, m := range explicitAnchorRE.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
	}
	return out
}

var explicitAnchorRE = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)

// section returns the lines (0-based start, end exclusive) under the heading whose anchor is
// given, up to the next heading of the same or a higher level.
func (d *doc) section(anchor string) (start, end int, ok bool) {
	hs := d.headings()
	for i, h := range hs {
		if h.anchor != anchor {
			continue
		}
		end = len(d.lines)
		for _, next := range hs[i+1:] {
			if next.level <= h.level {
				end = next.line - 1
				break
			}
		}
		return h.line, end, true
	}
	return 0, 0, false
}

// tableRows returns the cells of every table row in lines[start:end] whose first cell is not
// the header's delimiter row, with the 1-based line of each.
func (d *doc) tableRows(start, end int) (rows [][]string, lines []int) {
	for i := start; i < end; i++ {
		l := strings.TrimSpace(d.lines[i])
		if d.code[i] || !strings.HasPrefix(l, "|") {
			continue
		}
		cells := splitRow(l)
		if len(cells) > 0 && strings.Trim(cells[0], "-: ") == "" {
			continue
		}
		rows = append(rows, cells)
		lines = append(lines, i+1)
	}
	return rows, lines
}

// splitRow splits a table row into its trimmed cells; "\|" does not split.
func splitRow(l string) []string {
	l = strings.TrimSuffix(strings.TrimPrefix(l, "|"), "|")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(l); i++ {
		switch {
		case l[i] == '\\' && i+1 < len(l) && l[i+1] == '|':
			cur.WriteByte('|')
			i++
		case l[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(l[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

func TestSlug(t *testing.T) {
	for text, want := range map[string]string{
		"Envoy / Istio":                    "envoy--istio",
		"How it works":                     "how-it-works",
		"`server.fastPath` is deprecated":  "serverfastpath-is-deprecated",
		"Protect an existing Deployment":   "protect-an-existing-deployment",
		"What's new? (2026)":               "whats-new-2026",
		"[Linked](other.md) heading":       "linked-heading",
		"Metrics_and_alerts **now**":       "metrics_and_alerts-now",
		"Adaptive against Envoy's limiter": "adaptive-against-envoys-limiter",
	} {
		if got := slug(text); got != want {
			t.Errorf("slug(%q) = %q, want %q", text, got, want)
		}
	}
	d := parseDoc("x.md", "# A\n\n```\n# not a heading\n```\n## A\n### B ###\n")
	var got []string
	for _, h := range d.headings() {
		got = append(got, h.anchor)
	}
	if strings.Join(got, ",") != "a,a-1,b" {
		t.Errorf("anchors %v, want [a a-1 b]", got)
	}
}
