// Package chart loads the DAS Helm chart the operator installs: the copy of deploy/helm/das
// embedded at build time (see embedded/README.md), or a chart directory given with --chart.
package chart

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
)

// embedded holds embedded/README.md always and embedded/das/ once `make operator` copied it.
//
//go:embed all:embedded
var embedded embed.FS

// embeddedRoot is the chart's directory inside embedded.
const embeddedRoot = "embedded/das"

// ErrNotEmbedded says the binary was built without `make operator`'s copy of the chart.
var ErrNotEmbedded = errors.New("this operator was built without the DAS chart: build it with `make operator`, or pass --chart DIR")

// Load returns the chart in dir, or the embedded one when dir is empty.
func Load(dir string) (*chart.Chart, error) {
	if dir != "" {
		return loader.Load(dir)
	}
	return loadFS(embedded, embeddedRoot)
}

// loadFS reads every file below root of fsys into a chart, names relative to root.
func loadFS(fsys fs.FS, root string) (*chart.Chart, error) {
	if _, err := fs.Stat(fsys, path.Join(root, "Chart.yaml")); err != nil {
		return nil, ErrNotEmbedded
	}
	var files []*loader.BufferedFile
	err := fs.WalkDir(fsys, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		files = append(files, &loader.BufferedFile{Name: p[len(root)+1:], Data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read embedded chart: %w", err)
	}
	return loader.LoadFiles(files)
}
