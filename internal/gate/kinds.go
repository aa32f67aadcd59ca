package gate

import "github.com/loadshed/loadshed/internal/metrics"

// DoorKind is the front door a request came through: the "door" label of every metric.
type DoorKind uint8

// The front doors.
const (
	DoorHTTP    DoorKind = iota // the data port's HTTP reverse proxy (HTTP/1.1 and HTTP/2)
	DoorGRPC                    // gRPC calls on the data port
	DoorExtProc                 // Envoy's external processor

	numDoors = iota
)

var doorLabels = [numDoors]string{metrics.DoorHTTP, metrics.DoorGRPC, metrics.DoorExtProc}

// String is the door's label.
func (d DoorKind) String() string {
	if int(d) < len(doorLabels) {
		return doorLabels[d]
	}
	return doorLabels[DoorHTTP]
}

// Outcome is how an exchange went: the "outcome" label of loadshed_requests_total.
type Outcome uint8

// The outcomes, in label order.
const (
	OutcomeSuccess         Outcome = iota // the upstream answered 1xx-3xx (a gRPC call: OK)
	OutcomeClientError                    // the client's mistake (a 4xx, a malformed request)
	OutcomeUpstreamError                  // the upstream answered 5xx or could not be reached
	OutcomeUpstreamTimeout                // no answer in time
	OutcomeShed                           // refused by admission
	OutcomeCanceled                       // the client went away first

	numOutcomes = iota
)

var outcomeLabels = [numOutcomes]string{
	metrics.OutcomeSuccess, metrics.OutcomeClientError, metrics.OutcomeUpstreamError,
	metrics.OutcomeUpstreamTimeout, metrics.OutcomeShed, metrics.OutcomeCanceled,
}

// String is the outcome's label.
func (o Outcome) String() string {
	if int(o) < len(outcomeLabels) {
		return outcomeLabels[o]
	}
	return metrics.OutcomeUpstreamError
}
