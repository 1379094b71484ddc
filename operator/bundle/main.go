// Command das-bundle writes and checks the OLM bundle of the DAS operator.
//
//	das-bundle generate --version 0.1.0 --operator-image IMG --das-image IMG --out bundle
//	das-bundle validate bundle
//
// generate completes the base ClusterServiceVersion of deploy/olm/base with what changes per
// release or lives elsewhere in the repository (generate.go) and writes the bundle layout OLM
// reads: manifests/ (the CSV and the owned CRDs), metadata/annotations.yaml, and
// bundle.Dockerfile for `podman build`. validate runs operator-framework's validators on it
// (validate.go). Paths default to the repository layout; run it from the repository root.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "generate":
		err = generateCmd(os.Args[2:])
	case "validate":
		err = validateCmd(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "das-bundle:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: das-bundle generate [flags] | das-bundle validate [flags] DIR")
	os.Exit(2)
}

func generateCmd(args []string) error {
	fs := flag.NewFlagSet("generate", flag.ExitOnError)
	var in Inputs
	fs.StringVar(&in.BaseCSV, "base", "deploy/olm/base/das-operator.clusterserviceversion.yaml", "base ClusterServiceVersion")
	fs.StringVar(&in.OperatorCRD, "operator-crd", "deploy/olm/crd/operator.das.com_dasoperators.yaml", "the DASOperator CRD")
	fs.StringVar(&in.ChartCRD, "chart-crd", "deploy/helm/das/files/allocationclaims.yaml", "the AllocationClaim CRD (the chart's copy)")
	fs.StringVar(&in.ClusterRole, "cluster-role", "deploy/olm/rbac/cluster-role.yaml", "the operator's ClusterRole (clusterPermissions)")
	fs.StringVar(&in.Role, "role", "deploy/olm/rbac/role.yaml", "the operator's namespaced Role (permissions)")
	fs.StringVar(&in.SamplesDir, "samples", "deploy/olm/samples", "custom resources for alm-examples")
	fs.StringVar(&in.Version, "version", "", "operator version (semver; the DAS workspace version)")
	fs.StringVar(&in.Replaces, "replaces", "", "CSV this one upgrades from, e.g. das-operator.v0.1.0 (empty: none)")
	fs.StringVar(&in.OperatorImage, "operator-image", "", "the operator's image")
	fs.StringVar(&in.DASImage, "das-image", "", "the DAS image (plugin, controller, webhook)")
	fs.StringVar(&in.Channel, "channel", "candidate-v0", "OLM channel (also the default channel)")
	fs.StringVar(&in.OpenShiftVersions, "openshift-versions", "v4.21", "com.redhat.openshift.versions (DRA v1 needs Kubernetes 1.34, OpenShift 4.21)")
	out := fs.String("out", "bundle", "bundle directory to write (replaced)")
	_ = fs.Parse(args)
	if in.Version == "" || in.OperatorImage == "" || in.DASImage == "" {
		return fmt.Errorf("generate needs --version, --operator-image and --das-image")
	}
	files, err := Generate(in)
	if err != nil {
		return err
	}
	return WriteDir(*out, files)
}

func validateCmd(args []string) error {
	fs := flag.NewFlagSet("validate", flag.ExitOnError)
	k8s := fs.String("k8s-version", "1.34", "Kubernetes version the deprecated-API checks target")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("validate needs the bundle directory")
	}
	report, err := Validate(fs.Arg(0), *k8s)
	for _, line := range report {
		fmt.Println(line)
	}
	return err
}
