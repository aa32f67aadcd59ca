package extproc_test

import (
	"context"
	"net"
	"testing"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/door/extproc"
	"github.com/loadshed/loadshed/internal/gate"
)

// BenchmarkExtProcExchange: one admitted request's whole exchange with the door over gRPC on
// loopback, as Envoy has it with the recommended processing mode: a stream, the request headers
// and their CONTINUE, the response headers and theirs, the stream's end. The client's side (a
// grpc-go stream standing in for Envoy) is included in the figures.
func BenchmarkExtProcExchange(b *testing.B) {
	cfg, err := config.Parse([]byte("listen: \"\"\nextProc: {listen: 127.0.0.1:0}\nadmission: {strategy: adaptive}\n"))
	if err != nil {
		b.Fatal(err)
	}
	g, err := gate.New(cfg, gate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := extproc.New(g, ln, extproc.Options{})
	go srv.Serve()
	defer srv.Close()
	c := client(b, ln.Addr().String())
	req := headersMsg(":method", "GET", ":path", "/items/7", ":scheme", "http", ":authority", "shop", "user-agent", "k6", "accept", "*/*")
	res := responseMsg("200")
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		st, err := c.Process(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Send(req); err != nil {
			b.Fatal(err)
		}
		if m, err := st.Recv(); err != nil || m.GetRequestHeaders() == nil {
			b.Fatalf("%v %v", m, err)
		}
		if err := st.Send(res); err != nil {
			b.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			b.Fatal(err)
		}
		st.CloseSend()
		if _, err := st.Recv(); err == nil {
			b.Fatal("want the stream's end")
		}
	}
}
