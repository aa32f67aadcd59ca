package config

import (
	"slices"
	"strings"
	"testing"
)

// TestNameOnlyStrategiesRunOnTheirName: a configuration that names one of NameOnly and nothing
// else loads (what inject and the webhook generate); every other strategy but the chain is
// refused without its settings, so it is not offered to them.
func TestNameOnlyStrategiesRunOnTheirName(t *testing.T) {
	for _, name := range Strategies {
		_, err := Parse([]byte("upstream: http://127.0.0.1:8080\nadmission: {strategy: " + name + "}\n"))
		switch {
		case name == StrategyChain:
		case slices.Contains(NameOnly, name) && err != nil:
			t.Errorf("%s is in NameOnly but a configuration naming it alone is refused: %v", name, err)
		case !slices.Contains(NameOnly, name) && err == nil:
			t.Errorf("%s loads on its name alone but is not in NameOnly", name)
		}
	}
	if len(NameOnly) == 0 {
		t.Fatal("NameOnly is empty")
	}
}

// TestLoadReportsNeedACapacity: load reports say how much of the strategy's capacity is in
// use, so strategy none (no capacity) with loadReports.orca is refused naming the field, as is a
// report interval under a second; any other strategy takes them.
func TestLoadReportsNeedACapacity(t *testing.T) {
	for yaml, want := range map[string]string{
		"admission: {strategy: none}\nloadReports: {orca: true}\n":     "loadReports.orca",
		"loadReports: {orca: true, minInterval: 500ms}\n":              "loadReports.minInterval",
		"admission: {strategy: adaptive}\nloadReports: {orca: true}\n": "",
		"admission: {strategy: none}\nloadReports: {orca: false}\n":    "",
	} {
		_, err := Parse([]byte("upstream: http://127.0.0.1:8080\n" + yaml))
		switch {
		case want == "" && err != nil:
			t.Errorf("%q: refused: %v", yaml, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%q: %v, want an error naming %s", yaml, err, want)
		}
	}
}
