package chart

import (
	"errors"
	"os"
	"testing"
)

// The chart loads from its directory, and from a file system laid out as the embedded copy.
func TestLoadFromDirectoryAndFS(t *testing.T) {
	dir, err := Load("../../../deploy/helm/das")
	if err != nil {
		t.Fatal(err)
	}
	if dir.Name() != "das" {
		t.Fatalf("chart name %q", dir.Name())
	}
	fsys := os.DirFS("../../../deploy/helm")
	viaFS, err := loadFS(fsys, "das")
	if err != nil {
		t.Fatal(err)
	}
	if len(viaFS.Templates) != len(dir.Templates) || len(viaFS.Files) != len(dir.Files) {
		t.Fatalf("FS load has %d templates and %d files, directory load %d and %d",
			len(viaFS.Templates), len(viaFS.Files), len(dir.Templates), len(dir.Files))
	}
}

// Without the copy, loading says how to build it.
func TestMissingEmbeddedChartSaysHowToBuild(t *testing.T) {
	if _, err := loadFS(os.DirFS(t.TempDir()), "das"); !errors.Is(err, ErrNotEmbedded) {
		t.Fatalf("want ErrNotEmbedded, got %v", err)
	}
}
