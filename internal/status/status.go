// Package status is the sidecar's live status page on the admin port: GET / serves a page that
// reads GET /status/data.json about once a second and draws what it reads, with a chart of the last
// five minutes.
//
// Everything the page shows is derived from the same Prometheus registry that /metrics serves:
// a sampler gathers it once a second into a ring of snapshots (bounded: a few seconds of whole
// snapshots for the rates and quantiles, five minutes of chart points), so the page agrees with
// /metrics and reveals nothing that /metrics does not. The page is read-only (GET and HEAD only),
// and its HTML, script and style are embedded files served by this package under a
// Content-Security-Policy that allows nothing from anywhere else, and no inline script or style.
package status

import (
	"context"
	"embed"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Options.
const (
	DefaultInterval = time.Second
	DefaultHistory  = 5 * time.Minute
	DefaultWindow   = 5 * time.Second
)

// Options tune a Page; the zero value takes the defaults.
type Options struct {
	// Interval is the time between samples (default DefaultInterval).
	Interval time.Duration
	// History is how far back the chart goes (default DefaultHistory).
	History time.Duration
	// Window is what the rates and quantiles of the figures span (default DefaultWindow).
	Window time.Duration
}

// Page is the status page: an http.Handler for the admin port and the sampler that feeds it.
type Page struct {
	gather   prometheus.Gatherer
	interval time.Duration

	mu        sync.Mutex
	snaps     []*snapshot // the window's snapshots, a ring
	snapHead  int         // the next to write
	snapN     int         // how many are filled
	points    []point     // the chart's points, a ring
	pointHead int
	pointN    int
	samples   int

	json atomic.Pointer[[]byte] // the latest view, served as it is
}

// New returns a page that reads g (the registry /metrics serves). It samples only when Sample is
// called or while Run runs.
func New(g prometheus.Gatherer, opts Options) *Page {
	interval := opts.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	hist, window := opts.History, opts.Window
	if hist <= 0 {
		hist = DefaultHistory
	}
	if window <= 0 {
		window = DefaultWindow
	}
	nWindow := max(int(window/interval), 1) + 1 // a window of n intervals spans n+1 samples
	nPoints := max(int(hist/interval), 2)
	return &Page{gather: g, interval: interval, snaps: make([]*snapshot, nWindow), points: make([]point, nPoints)}
}

// Run samples the registry now and then every interval until ctx ends. One goroutine does all
// the work, however many pages are open: a request only copies the latest view.
func (p *Page) Run(ctx context.Context) {
	p.Sample(time.Now())
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			p.Sample(now)
		}
	}
}

// Sample gathers the registry as of now, adds the snapshot to the rings and renews the view the
// page reads. A registry that fails to gather some collector still gives what it gathered, as
// /metrics does with ContinueOnError.
func (p *Page) Sample(now time.Time) {
	mfs, _ := p.gather.Gather()
	cur := reduce(now, mfs)

	p.mu.Lock()
	var prev *snapshot
	if p.snapN > 0 {
		prev = p.snaps[(p.snapHead+len(p.snaps)-1)%len(p.snaps)]
	}
	p.snaps[p.snapHead] = cur
	p.snapHead = (p.snapHead + 1) % len(p.snaps)
	p.snapN = min(p.snapN+1, len(p.snaps))
	p.points[p.pointHead] = pointOf(cur, prev)
	p.pointHead = (p.pointHead + 1) % len(p.points)
	p.pointN = min(p.pointN+1, len(p.points))
	p.samples++
	oldest := p.snaps[(p.snapHead+len(p.snaps)-p.snapN)%len(p.snaps)]
	points := make([]point, 0, p.pointN)
	for i := p.pointN; i > 0; i-- {
		points = append(points, p.points[(p.pointHead+len(p.points)-i)%len(p.points)])
	}
	v := buildView(cur, oldest, points, p.samples, p.interval)
	p.mu.Unlock()

	b, err := json.Marshal(v)
	if err != nil {
		return // cannot happen: every field marshals; the last view stays
	}
	p.json.Store(&b)
}

//go:embed web
var web embed.FS

// files are the page's files, by path, with their content types.
var files = map[string]struct{ name, ctype string }{
	"/":                {"web/index.html", "text/html; charset=utf-8"},
	"/status/page.js":  {"web/page.js", "text/javascript; charset=utf-8"},
	"/status/page.css": {"web/page.css", "text/css; charset=utf-8"},
}

// DataPath is the path of the JSON the page reads.
const DataPath = "/status/data.json"

// ContentSecurityPolicy lets the page load its own script, style and data, and nothing else: no
// inline script or style, no other origin, no frames, no forms.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// ServeHTTP serves the page (/), its script and style (/status/page.js, /status/page.css) and
// the view (DataPath); GET and HEAD only. Mount it on "GET /{$}" and "GET /status/".
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "status page: method "+r.Method+" not allowed, only GET and HEAD", http.StatusMethodNotAllowed)
		return
	}
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if r.URL.Path == DataPath {
		h.Set("Content-Type", "application/json")
		b := p.json.Load()
		if b == nil {
			w.Write([]byte(`{"samples":0}`))
			return
		}
		w.Write(*b)
		return
	}
	f, ok := files[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	body, err := web.ReadFile(f.name)
	if err != nil {
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h.Set("Content-Type", f.ctype)
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	w.Write(body)
}
