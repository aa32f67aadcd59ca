package slowtail_test

import (
	"fmt"
	"time"

	"github.com/loadshed/loadshed/internal/slowtail"
)

func ExampleNew() {
	// A constant service time, as tests use it.
	s := slowtail.New(slowtail.Constant(20*time.Millisecond), 1)
	fmt.Println(s.Sample(), s.Sample())

	// The default slow-tail model; the same seed always gives the same sequence.
	a, b := slowtail.New(slowtail.DefaultConfig(), 42), slowtail.New(slowtail.DefaultConfig(), 42)
	same := true
	for range 1000 {
		same = same && a.Sample() == b.Sample()
	}
	fmt.Println("same sequence:", same)
	// Output:
	// 20ms 20ms
	// same sequence: true
}
