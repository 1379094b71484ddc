package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// listedImage is what `ociimage list` prints.
type listedImage struct {
	// Name from the index's io.containerd.image.name (or ref.name) annotation.
	Name       string            `json:"name"`
	Entrypoint []string          `json:"entrypoint"`
	User       string            `json:"user"`
	Env        []string          `json:"env"`
	Labels     map[string]string `json:"labels"`
	Files      []listedFile      `json:"files"`
}

// listedFile is one path of the image's flattened filesystem.
type listedFile struct {
	Path string `json:"path"` // absolute
	// Type: "file", "dir" or "symlink".
	Type string `json:"type"`
	Mode int64  `json:"mode"`
	Size int64  `json:"size"`
	Link string `json:"link,omitempty"`
	// For ELF files: PT_INTERP (the dynamic loader) and DT_NEEDED (shared libraries by soname).
	Interpreter string   `json:"interpreter,omitempty"`
	Needed      []string `json:"needed,omitempty"`
}

// listImage reads the OCI archive (a tar of an OCI image layout holding one image) and prints
// it as JSON.
func listImage(archive string, w io.Writer) error {
	dir, err := os.MkdirTemp("", "ociimage-list-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := untar(archive, dir); err != nil {
		return err
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		return fmt.Errorf("%s is not an OCI image layout archive: %w", archive, err)
	}
	index, err := lp.ImageIndex()
	if err != nil {
		return err
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		return err
	}
	if len(manifest.Manifests) != 1 {
		return fmt.Errorf("%s holds %d images, want 1", archive, len(manifest.Manifests))
	}
	desc := manifest.Manifests[0]
	img, err := index.Image(desc.Digest)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	out := listedImage{
		Name:       desc.Annotations["io.containerd.image.name"],
		Entrypoint: cfg.Config.Entrypoint,
		User:       cfg.Config.User,
		Env:        cfg.Config.Env,
		Labels:     cfg.Config.Labels,
	}
	if out.Name == "" {
		out.Name = desc.Annotations["org.opencontainers.image.ref.name"]
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	if out.Files, err = listFiles(tar.NewReader(rc)); err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func listFiles(tr *tar.Reader) ([]listedFile, error) {
	var files []listedFile
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		f := listedFile{Path: "/" + strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/"), Mode: hdr.Mode & 0o7777, Size: hdr.Size}
		switch hdr.Typeflag {
		case tar.TypeDir:
			f.Type = "dir"
		case tar.TypeSymlink:
			f.Type, f.Link = "symlink", hdr.Linkname
		case tar.TypeReg:
			f.Type = "file"
			data, err := io.ReadAll(tr)
			if err != nil {
				return nil, err
			}
			if bytes.HasPrefix(data, []byte(elf.ELFMAG)) {
				f.Interpreter, f.Needed = elfDeps(data)
			}
		default:
			f.Type = fmt.Sprintf("tar type %c", hdr.Typeflag)
		}
		files = append(files, f)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files, nil
}

// elfDeps returns an ELF file's program interpreter and needed libraries (empty for a file
// that is not a readable ELF object).
func elfDeps(data []byte) (string, []string) {
	ef, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return "", nil
	}
	defer ef.Close()
	var interp string
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			b, _ := io.ReadAll(p.Open())
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	needed, _ := ef.ImportedLibraries()
	return interp, needed
}

// untar unpacks an archive of regular files and directories into dir.
func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", archive, err)
		}
		p := filepath.Join(dir, filepath.Clean("/"+hdr.Name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = writeFile(p, tr)
			}
		}
		if err != nil {
			return err
		}
	}
}

func writeFile(p string, r io.Reader) error {
	out, err := os.Create(p)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
