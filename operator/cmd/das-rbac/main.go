// Command das-rbac writes or checks the DAS operator's RBAC (deploy/olm/rbac) from the chart:
//
//	das-rbac --chart ../deploy/helm/das --out ../deploy/olm/rbac           # make operator-rbac
//	das-rbac --chart ../deploy/helm/das --out ../deploy/olm/rbac --check   # make bundle
//
// See package internal/rbac for what is derived and why.
package main

import (
	"flag"
	"fmt"
	"os"

	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/das-project/das/operator/internal/rbac"
)

func main() {
	chartDir := flag.String("chart", "../deploy/helm/das", "the DAS chart")
	out := flag.String("out", "../deploy/olm/rbac", "directory of cluster-role.yaml and role.yaml")
	check := flag.Bool("check", false, "only compare the files with what the chart gives; exit 1 when they differ")
	flag.Parse()
	if err := run(*chartDir, *out, *check); err != nil {
		fmt.Fprintln(os.Stderr, "das-rbac:", err)
		os.Exit(1)
	}
}

func run(chartDir, out string, check bool) error {
	c, err := loader.Load(chartDir)
	if err != nil {
		return err
	}
	objs, err := rbac.Render(c)
	if err != nil {
		return err
	}
	p, err := rbac.Derive(objs, rbac.Namespace)
	if err != nil {
		return err
	}
	if check {
		return rbac.Check(out, p)
	}
	return rbac.Write(out, p)
}
