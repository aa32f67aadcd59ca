package backend

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxAdminBody bounds a POST /admin/config body.
const maxAdminBody = 64 << 10

// AdminHandler returns the admin-port handler. It is a TEST TOOL: it changes the backend's
// behaviour at run time, so serve it only on a listener of its own and only when asked.
//
//	GET  /admin/config  the current model as JSON, durations as Go duration strings:
//	                    {"workers":8,"mean":"20ms","stddev":"5ms","tailProb":0.01,
//	                     "tailMean":"300ms","tailMin":"100ms","tailMax":"2s","fanout":1,
//	                     "seed":1}
//	POST /admin/config  a partial object of the same fields; applied at once (workers may shrink
//	                    or grow under load) and answered with the new config. A "seed", even
//	                    the current one, starts the service-time sequence over from it. Unknown fields,
//	                    wrong types and invalid values get 400 with {"errors":["field: problem",
//	                    ...]} and change nothing.
//	GET  /healthz       200 "ok", or 503 once the Server is closed
//	GET  /metrics       the registry's metrics (backend_*)
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/config", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, toJSON(s.Config()))
	})
	mux.HandleFunc("POST /admin/config", s.postConfig)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		select {
		case <-s.done:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "closed\n")
		default:
			_, _ = io.WriteString(w, "ok\n")
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	return mux
}

type errorsJSON struct {
	Errors []string `json:"errors"`
}

func (s *Server) postConfig(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		code := http.StatusBadRequest
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			code = http.StatusRequestEntityTooLarge
		}
		writeJSON(w, code, errorsJSON{[]string{"body: " + err.Error()}})
		return
	}
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	// Fields that did not parse keep their current (valid) values, so Validate reports only the
	// problems of the fields that did: the client learns of every problem at once.
	next, reseed, problems := applyPatch(s.Config(), body)
	problems = append(problems, Problems(next.Validate())...)
	if len(problems) > 0 {
		writeJSON(w, http.StatusBadRequest, errorsJSON{problems})
		return
	}
	if err := s.Update(next); err != nil { // validated above; kept for safety
		writeJSON(w, http.StatusBadRequest, errorsJSON{Problems(err)})
		return
	}
	if reseed {
		s.Reseed(next.Seed)
	}
	writeJSON(w, http.StatusOK, toJSON(s.Config()))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}
