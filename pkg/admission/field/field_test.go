package field

import (
	"errors"
	"reflect"
	"testing"
)

func TestNestPlacesProblemsUnderThePath(t *testing.T) {
	var inner Errors
	inner.Add("buffer", "must not be negative, got %v", -0.1)
	inner.Add("", "whole value is wrong")
	var outer Errors
	outer.Add("strategy", "required")
	outer.Nest("admission.adaptive.gradient", inner.Err())
	outer.Nest("admission.chain", errors.New("plain error"))
	outer.Nest("ignored", nil)
	want := []string{"strategy", "admission.adaptive.gradient.buffer", "admission.adaptive.gradient", "admission.chain"}
	if got := outer.Fields(); !reflect.DeepEqual(got, want) {
		t.Fatalf("fields = %q, want %q", got, want)
	}
	if got := outer.Problems[3].Detail; got != "plain error" {
		t.Errorf("plain error detail = %q", got)
	}
	var as *Errors
	if err := outer.Err(); !errors.As(err, &as) || len(as.Problems) != 4 {
		t.Fatalf("Err() = %v, want the *Errors itself", err)
	}
}

func TestErrIsNilWhenEmpty(t *testing.T) {
	var e Errors
	if err := e.Err(); err != nil {
		t.Fatalf("empty Errors: Err() = %v", err)
	}
	var nilErrs *Errors
	if err := nilErrs.Err(); err != nil {
		t.Fatalf("nil *Errors: Err() = %v", err)
	}
}

func TestJoin(t *testing.T) {
	for _, c := range []struct{ prefix, field, want string }{
		{"", "a", "a"}, {"a", "", "a"}, {"a", "b", "a.b"}, {"chain", "[2]", "chain[2]"},
	} {
		if got := Join(c.prefix, c.field); got != c.want {
			t.Errorf("Join(%q, %q) = %q, want %q", c.prefix, c.field, got, c.want)
		}
	}
}
