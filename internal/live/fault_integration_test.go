//go:build integration

package live

import (
	"io"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/config"
)

// TestFaultSIGTERMDuringOverloadWithBacklog: the proxy process gets SIGTERM at 10x overload
// while its bounded queue is full. Requests keep arriving for part of the drain delay (as they
// do while Kubernetes removes the pod from its endpoints). Every request gets an HTTP answer:
// 200, or 503 with Retry-After (queue_full while overloaded, draining for what the grace period
// could not reach); queued work goes on being served after the listener closes, requests
// admitted before the grace period ended finish after the draining refusals, and the process
// exits 0.
func TestFaultSIGTERMDuringOverloadWithBacklog(t *testing.T) {
	const (
		drainDelay = 500 * time.Millisecond
		grace      = 300 * time.Millisecond
		sendAfter  = 250 * time.Millisecond // the load stops this long after SIGTERM, within drainDelay
	)
	c := Capacity{Workers: 4, Service: 50 * time.Millisecond} // 80 rps
	e, err := Start(Setup{Workers: c.Workers, Service: Constant(c.Service),
		Admission:   policy(t, "strategy: bounded-queue\nboundedQueue: {concurrency: 4, depth: 128, maxWait: 10s}"),
		Shutdown:    &config.Shutdown{DrainDelay: config.Duration(drainDelay), GracePeriod: config.Duration(grace)},
		ProxyBinary: proxyBinary})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()

	type answer struct {
		code       int
		reason     string
		retryAfter string
		err        error
		done       time.Time
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}, Timeout: 20 * time.Second}
	defer client.CloseIdleConnections()
	send := func() {
		defer wg.Done()
		res, err := client.Get(e.ProxyURL + "/")
		a := answer{err: err}
		if err == nil {
			_, a.err = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			a.code, a.reason, a.retryAfter = res.StatusCode, res.Header.Get("X-Loadshed-Reason"), res.Header.Get("Retry-After")
		}
		a.done = time.Now()
		mu.Lock()
		answers = append(answers, a)
		mu.Unlock()
	}
	// 10x overload, open model: one request every 1.25 ms, bounded by a count and by time.
	stop := make(chan struct{})
	senderDone := make(chan struct{})
	go func() {
		defer close(senderDone)
		tick := time.NewTicker(time.Second / time.Duration(10*c.RPS()))
		defer tick.Stop()
		deadline := time.After(10 * time.Second)
		for n := 0; n < 8000; n++ {
			select {
			case <-stop:
				return
			case <-deadline:
				return
			case <-tick.C:
				wg.Add(1)
				go send()
			}
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for scrape(t, e.ProxyAdmin, "loadshed_queue_depth") < 100 {
		if time.Now().After(deadline) {
			t.Fatal("no backlog built up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	sigAt := time.Now()
	if err := e.ProxyProcess.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(sendAfter, func() { close(stop) })
	<-senderDone
	wg.Wait()
	if err := e.ProxyProcess.Wait(); err != nil {
		t.Fatalf("proxy exit: %v, want exit code 0", err)
	}

	count := map[string]int{}
	var servedAfterClose, lastServed, firstDraining time.Time
	for _, a := range answers {
		if a.err != nil {
			t.Fatalf("a request got no answer: %v", a.err)
		}
		switch {
		case a.code == 200:
			if a.done.After(sigAt.Add(drainDelay)) && servedAfterClose.IsZero() {
				servedAfterClose = a.done
			}
			if a.done.After(lastServed) {
				lastServed = a.done
			}
		case a.code == 503 && (a.reason == "queue_full" || a.reason == "draining"):
			if a.retryAfter == "" {
				t.Fatalf("503 %s without Retry-After", a.reason)
			}
			if a.reason == "draining" && (firstDraining.IsZero() || a.done.Before(firstDraining)) {
				firstDraining = a.done
			}
		default:
			t.Fatalf("unexpected answer %d %q", a.code, a.reason)
		}
		count[a.reason]++
	}
	t.Logf("%d requests: %d served, %d queue_full, %d draining; last served %s after the first draining refusal",
		len(answers), count[""], count["queue_full"], count["draining"], lastServed.Sub(firstDraining))
	if count["queue_full"] == 0 {
		t.Error("no overload sheds: the test did not overload the proxy")
	}
	if servedAfterClose.IsZero() {
		t.Error("nothing was served after the drain delay: queued work must go on during the grace period")
	}
	if count["draining"] == 0 {
		t.Error("no draining refusals: the backlog was meant to outlast the grace period")
	} else if !lastServed.After(firstDraining) {
		t.Error("requests in flight when the grace period ended must still finish (after the draining refusals)")
	}
}
