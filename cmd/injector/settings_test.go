package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/loadshed/loadshed/cmd/inject/inject"
)

// TestSettingsFiles: testdata/valid-*.yaml load; every testdata/invalid-*.yaml fails with each
// problem its "# want:" lines name.
func TestSettingsFiles(t *testing.T) {
	files, _ := filepath.Glob("testdata/*-*.yaml")
	if len(files) < 4 {
		t.Fatalf("only %d settings files in testdata", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			s, err := loadSettings(f)
			if strings.HasPrefix(filepath.Base(f), "valid-") {
				if err != nil {
					t.Fatal(err)
				}
				if s.Image == "" || s.Strategy == "" || s.Port == 0 || s.DrainSeconds == 0 || s.Resources.Requests == nil {
					t.Errorf("defaults not applied: %+v", s)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			b, _ := os.ReadFile(f)
			for _, line := range strings.Split(string(b), "\n") {
				if want, ok := strings.CutPrefix(line, "# want: "); ok && !strings.Contains(err.Error(), want) {
					t.Errorf("error does not say %q:\n%v", want, err)
				}
			}
		})
	}
}

func TestSettingsValues(t *testing.T) {
	s, err := loadSettings("testdata/valid-full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s.Image != "registry.example/loadshed:v0.1.0" || s.Strategy != "codel" || s.ConfigMap != "loadshed-sidecar" ||
		s.PortName != "http" || s.Port != 8100 || s.AdminPort != 9911 || s.DrainSeconds != 8 || s.GraceSeconds != 15 ||
		s.PreStop != inject.PreStopExec || !s.Resources.Limits.Memory().Equal(resource.MustParse("64Mi")) {
		t.Errorf("settings %+v", s)
	}
	if s.LoadReports != inject.LoadReportsNone {
		t.Errorf("loadReports not set: %q, want the default none", s.LoadReports)
	}
	if s, err := loadSettings("testdata/valid-load-reports.yaml"); err != nil || s.LoadReports != inject.LoadReportsORCA {
		t.Errorf("loadReports: orca read as %q (%v)", s.LoadReports, err)
	}
	empty, err := loadSettings("")
	if err != nil || empty.Image != inject.DefaultImage || empty.Strategy != inject.DefaultStrategy {
		t.Errorf("no file: %+v, %v", empty, err)
	}
}
