package config

import (
	"slices"
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
