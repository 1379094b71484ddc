package main

import (
	"fmt"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
	interfaces "github.com/operator-framework/api/pkg/validation/interfaces"
)

// validators are the suites `operator-sdk bundle validate --select-optional
// suite=operatorframework` runs (the default bundle checks, OperatorHub's, good practices,
// deprecated APIs), plus the object checks (PodDisruptionBudgets, SCCs in the bundle).
var validators = interfaces.Validators{
	validation.ClusterServiceVersionValidator,
	validation.CustomResourceDefinitionValidator,
	validation.BundleValidator,
	validation.OperatorHubV2Validator,
	validation.StandardCapabilitiesValidator,
	validation.StandardCategoriesValidator,
	validation.GoodPracticesValidator,
	validation.AlphaDeprecatedAPIsValidator,
	validation.ObjectValidator,
}

// Validate loads the bundle in dir and runs the validators. Every error and every warning is
// reported; either fails the check, so that a warning is fixed while it is one line.
func Validate(dir, k8sVersion string) ([]string, error) {
	bundle, err := manifests.GetBundleFromDir(dir)
	if err != nil {
		return nil, fmt.Errorf("load bundle %s: %w", dir, err)
	}
	objs := bundle.ObjectsToValidate()
	objs = append(objs, map[string]string{"k8s-version": k8sVersion})
	var report []string
	failed := 0
	for _, result := range validators.Validate(objs...) {
		for _, e := range result.Errors {
			report = append(report, fmt.Sprintf("ERROR %s: %s", result.Name, e))
			failed++
		}
		for _, w := range result.Warnings {
			report = append(report, fmt.Sprintf("WARN  %s: %s", result.Name, w))
			if w.Level == errors.LevelWarn {
				failed++
			}
		}
	}
	if failed > 0 {
		return report, fmt.Errorf("bundle %s: %d errors and warnings (above)", dir, failed)
	}
	report = append(report, fmt.Sprintf("bundle %s (%s) passes %d validator suites", dir, bundle.CSV.GetName(), len(validators)))
	return report, nil
}
