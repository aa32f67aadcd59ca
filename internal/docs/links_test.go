package docs

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// linkRE matches an inline link or image, [text](target "title"), after code spans are blanked.
	linkRE = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	// refDefRE matches a reference definition, [label]: target.
	refDefRE = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	// htmlLinkRE matches the target of an HTML link or image.
	htmlLinkRE = regexp.MustCompile(`<(?:a|img)\s[^>]*?(?:href|src)="([^"]*)"`)
	schemeRE   = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	lineRefRE  = regexp.MustCompile(`^L\d+(-L\d+)?$`)
)

// link is one link target found in a doc.
type link struct {
	line   int
	target string
}

// links returns every link target of the doc outside code blocks and code spans.
func (d *doc) links() []link {
	var out []link
	for i, l := range d.lines {
		if d.code[i] {
			continue
		}
		l = blankCodeSpans(l)
		for _, re := range []*regexp.Regexp{linkRE, refDefRE, htmlLinkRE} {
			for _, m := range re.FindAllStringSubmatch(l, -1) {
				out = append(out, link{line: i + 1, target: m[1]})
			}
		}
	}
	return out
}

// blankCodeSpans replaces the content of every code span with x's, so that brackets inside
// code are not read as links (the span itself stays, as a link's text may be code).
func blankCodeSpans(l string) string {
	return codeSpanRE.ReplaceAllStringFunc(l, func(s string) string {
		return "`" + strings.Repeat("x", len(s)-2) + "`"
	})
}

// TestRelativeLinksResolve checks every relative link of README.md, deploy/README.md and
// docs/**: its file exists in the repository and its #anchor is a heading of the target (by
// GitHub's rules) or an explicit anchor.
func TestRelativeLinksResolve(t *testing.T) {
	anchors := map[string]map[string]bool{} // by path relative to root
	anchorsOf := func(rel string) map[string]bool {
		if a, ok := anchors[rel]; ok {
			return a
		}
		a := readDoc(t, rel).anchors()
		anchors[rel] = a
		return a
	}
	n := 0
	for _, rel := range checkedFiles(t) {
		d := readDoc(t, rel)
		for _, l := range d.links() {
			if err := checkLink(rel, l.target, anchorsOf); err != nil {
				t.Errorf("%s:%d: link %q: %v", rel, l.line, l.target, err)
			}
			n++
		}
	}
	if n < 50 {
		t.Errorf("only %d links found: the link extraction is broken", n)
	}
}

// checkLink checks one link target of the file from (relative to root).
func checkLink(from, target string, anchorsOf func(string) map[string]bool) error {
	if target == "" {
		return fmt.Errorf("empty target")
	}
	if schemeRE.MatchString(target) || strings.HasPrefix(target, "//") {
		return nil // absolute: not checked here
	}
	p, frag, _ := strings.Cut(target, "#")
	p, err := url.PathUnescape(p)
	if err != nil {
		return fmt.Errorf("bad escape: %v", err)
	}
	to := from
	if p != "" {
		if strings.HasPrefix(p, "/") {
			return fmt.Errorf("absolute path: write it relative to %s", path.Dir(from))
		}
		to = path.Clean(path.Join(path.Dir(from), p))
		if to == ".." || strings.HasPrefix(to, "../") {
			return fmt.Errorf("leaves the repository")
		}
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(to))); err != nil {
			return fmt.Errorf("no such file: %s", to)
		}
	}
	if frag == "" {
		return nil
	}
	if !strings.HasSuffix(to, ".md") {
		if lineRefRE.MatchString(frag) {
			return nil
		}
		return fmt.Errorf("anchor #%s into %s, which is not Markdown", frag, to)
	}
	if !anchorsOf(to)[frag] {
		return fmt.Errorf("no heading with anchor #%s in %s", frag, to)
	}
	return nil
}

func TestLinkExtraction(t *testing.T) {
	d := parseDoc("docs/x.md", strings.Join([]string{
		"See [a](a.md#b), ![img](../c.png \"title\") and [`code`](d.md).",
		"Not `[a link](in code)`; [ext](https://example.com).",
		"```",
		"[in a block](e.md)",
		"```",
		"[ref]: f.md#g",
		`<img src="h.png" alt="">`,
	}, "\n"))
	var got []string
	for _, l := range d.links() {
		got = append(got, fmt.Sprintf("%d:%s", l.line, l.target))
	}
	want := "1:a.md#b 1:../c.png 1:d.md 2:https://example.com 6:f.md#g 7:h.png"
	if strings.Join(got, " ") != want {
		t.Errorf("links = %v, want %s", got, want)
	}
	none := func(string) map[string]bool { return map[string]bool{"there": true} }
	for target, ok := range map[string]bool{
		"../README.md": true, "../README.md#there": true, "../README.md#nowhere": false,
		"missing.md": false, "../../outside.md": false, "/docs/x.md": false, "#there": true,
		"../go.mod#L3": true, "../go.mod#here": false,
	} {
		err := checkLink("docs/configuration.md", target, none)
		if (err == nil) != ok {
			t.Errorf("checkLink(%q) = %v, want ok=%v", target, err, ok)
		}
	}
}
