package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/loadshed/loadshed/cmd/inject/inject"
	"github.com/loadshed/loadshed/internal/config"
)

// fileSettings is the injector's settings file (the chart mounts it from its ConfigMap): what
// every injected sidecar gets. Zero fields take inject.Settings' defaults.
type fileSettings struct {
	// Image is the sidecar's image.
	Image string `json:"image"`
	// Strategy is the admission strategy of the generated configuration.
	Strategy string `json:"strategy"`
	// ConfigMap names a ConfigMap (key config.yaml) that every injected pod's namespace holds;
	// empty generates the configuration per pod.
	ConfigMap string `json:"configMap"`
	// PortName is the application's port to take over; empty means the pod's only named port.
	PortName string `json:"portName"`
	// SidecarPort and AdminPort are the sidecar's port numbers, moved up if the pod uses them.
	SidecarPort int32 `json:"sidecarPort"`
	AdminPort   int32 `json:"adminPort"`
	// DrainSeconds is how long a stopping pod keeps serving while its endpoints update.
	DrainSeconds int64 `json:"drainSeconds"`
	// GraceSeconds is the sidecar's shutdown grace period.
	GraceSeconds int64 `json:"graceSeconds"`
	// PreStop is auto, sleep, exec or none.
	PreStop string `json:"preStop"`
	// LoadReports is orca (the generated configuration reports the pod's load to the balancers)
	// or none.
	LoadReports string                      `json:"loadReports"`
	Resources   corev1.ResourceRequirements `json:"resources"`
}

// loadSettings reads a settings file strictly (an unknown field is an error) and validates it;
// an empty path means every default.
func loadSettings(path string) (inject.Settings, error) {
	var fs fileSettings
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return inject.Settings{}, err
		}
		if err := yaml.UnmarshalStrict(b, &fs); err != nil {
			return inject.Settings{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	s, err := fs.settings()
	if err != nil {
		return inject.Settings{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// settings validates the file's values, naming every field that is wrong, and returns them as
// the library's Settings.
func (fs fileSettings) settings() (inject.Settings, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if fs.Strategy != "" && !slices.Contains(config.NameOnly, fs.Strategy) {
		bad("strategy", "%s", inject.StrategyProblem(fs.Strategy, config.NameOnly))
	}
	if fs.ConfigMap != "" {
		if e := validation.IsDNS1123Subdomain(fs.ConfigMap); len(e) > 0 {
			bad("configMap", "%q is not a ConfigMap name: %s", fs.ConfigMap, strings.Join(e, "; "))
		}
	}
	if fs.PortName != "" {
		if e := validation.IsValidPortName(fs.PortName); len(e) > 0 {
			bad("portName", "%q is not a port name: %s", fs.PortName, strings.Join(e, "; "))
		}
	}
	for field, p := range map[string]int32{"sidecarPort": fs.SidecarPort, "adminPort": fs.AdminPort} {
		if p < 0 || p > 65535 {
			bad(field, "%d is not a port number", p)
		}
	}
	if fs.SidecarPort != 0 && fs.SidecarPort == fs.AdminPort {
		bad("adminPort", "%d is also sidecarPort", fs.AdminPort)
	}
	if fs.DrainSeconds < 0 || fs.DrainSeconds > inject.MaxDrainSeconds {
		bad("drainSeconds", "%d, want 0 to %d (the sidecar's /drain takes at most 10m)", fs.DrainSeconds, inject.MaxDrainSeconds)
	}
	if fs.GraceSeconds < 0 {
		bad("graceSeconds", "%d is negative", fs.GraceSeconds)
	}
	var preStop inject.PreStop
	if fs.PreStop != "" {
		var err error
		if preStop, err = inject.ParsePreStop(fs.PreStop); err != nil {
			bad("preStop", "%v", err)
		}
	}
	var reports inject.LoadReports
	if fs.LoadReports != "" {
		var err error
		if reports, err = inject.ParseLoadReports(fs.LoadReports); err != nil {
			bad("loadReports", "%v", err)
		}
		if reports == inject.LoadReportsORCA && fs.Strategy == "none" {
			bad("loadReports", "orca needs a strategy with a capacity to report against, and strategy is none")
		}
		if reports == inject.LoadReportsORCA && fs.ConfigMap != "" {
			bad("loadReports", "orca: the sidecars read configMap %s, which the injector does not write: set loadReports there", fs.ConfigMap)
		}
	}
	for name, q := range fs.Resources.Requests {
		if l, ok := fs.Resources.Limits[name]; ok && q.Cmp(l) > 0 {
			bad("resources.requests."+string(name), "%s is above the limit %s", q.String(), l.String())
		}
	}
	if len(errs) > 0 {
		slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
		return inject.Settings{}, errors.Join(errs...)
	}
	return inject.Settings{
		Image:        fs.Image,
		Strategy:     fs.Strategy,
		ConfigMap:    fs.ConfigMap,
		PortName:     fs.PortName,
		Port:         fs.SidecarPort,
		AdminPort:    fs.AdminPort,
		DrainSeconds: fs.DrainSeconds,
		GraceSeconds: fs.GraceSeconds,
		PreStop:      preStop,
		LoadReports:  reports,
		Resources:    fs.Resources,
	}.Defaults(), nil
}
