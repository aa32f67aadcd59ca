package gate

import "strconv"

// AnswerText is the short body of an answer a door writes itself, the same through every door:
// the status, its reason phrase and what happened ("503 Service Unavailable: concurrency_limit").
func AnswerText(status int, msg string) string {
	return strconv.Itoa(status) + " " + statusText[status] + ": " + msg + "\n"
}

// Body is the text of a refusal's answer to an HTTP request.
func (r *Refusal) Body() string { return AnswerText(r.Status, string(r.Reason)) }

// Body is the text of the answer to the client's mistake.
func (e *ClientError) Body() string { return AnswerText(e.Status, e.Error()) }

// statusText holds the reason phrases of the error statuses (RFC 9110 and the IANA registry, as
// net/http spells them) that a door answers with: the gate does not import a transport for them.
var statusText = map[int]string{
	400: "Bad Request",
	401: "Unauthorized",
	402: "Payment Required",
	403: "Forbidden",
	404: "Not Found",
	405: "Method Not Allowed",
	406: "Not Acceptable",
	407: "Proxy Authentication Required",
	408: "Request Timeout",
	409: "Conflict",
	410: "Gone",
	411: "Length Required",
	412: "Precondition Failed",
	413: "Request Entity Too Large",
	414: "Request URI Too Long",
	415: "Unsupported Media Type",
	416: "Requested Range Not Satisfiable",
	417: "Expectation Failed",
	418: "I'm a teapot",
	421: "Misdirected Request",
	422: "Unprocessable Entity",
	423: "Locked",
	424: "Failed Dependency",
	425: "Too Early",
	426: "Upgrade Required",
	428: "Precondition Required",
	429: "Too Many Requests",
	431: "Request Header Fields Too Large",
	451: "Unavailable For Legal Reasons",
	500: "Internal Server Error",
	501: "Not Implemented",
	502: "Bad Gateway",
	503: "Service Unavailable",
	504: "Gateway Timeout",
	505: "HTTP Version Not Supported",
	506: "Variant Also Negotiates",
	507: "Insufficient Storage",
	508: "Loop Detected",
	510: "Not Extended",
	511: "Network Authentication Required",
}
