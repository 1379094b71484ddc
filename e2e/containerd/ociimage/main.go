// Command ociimage builds a one-layer container image from files on this machine, with no
// registry and no daemon, and writes it as an OCI image archive (a tar of an OCI image layout,
// image-spec image-layout.md) that `ctr images import` and `podman load` read.
//
//	ociimage --name das.local/probe:1 --out probe.tar [--entrypoint /probe] \
//	    [--rootfs DIR] [--file /abs/host/probe:/probe[:0755]] ... [--link /pause:/probe] \
//	    [--env K=V] [--label K=V] [--user UID:GID]
//	ociimage list ARCHIVE
//
// The image layout, manifest and config are written by go-containerregistry; this program only
// chooses the files. Files are owned by root (0:0) with the given mode (default: the host file's
// mode); their parent directories are created 0755. `--rootfs` adds a whole directory tree
// (directories, files and symlinks with their modes) below `/`; `--file` entries come after it
// and replace files of the same path.
//
// `list` prints an archive's image as JSON (see listImage): its name, config (entrypoint, user,
// labels, env) and every file of its flattened filesystem, with each ELF file's program
// interpreter and needed libraries, so a test can compare two images' layouts and check that
// every binary's libraries are in the image.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// entry is one file or symlink of the layer.
type entry struct {
	dst  string // absolute path in the image
	src  string // host file; empty for a symlink
	link string // symlink target
	mode int64
	dir  bool // a directory (from --rootfs)
}

// imageConfig is what the image's config says besides its layers.
type imageConfig struct {
	entrypoint string
	user       string
	env        []string
	labels     map[string]string
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "list" {
		if err := listImage(os.Args[2], os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "ociimage list: %v\n", err)
			os.Exit(1)
		}
		return
	}
	var name, out, rootfs string
	var cfg imageConfig
	var files, links, env, labels listFlag
	flag.StringVar(&name, "name", "", "image name, e.g. das.local/probe:1 (required)")
	flag.StringVar(&out, "out", "", "OCI archive to write (required)")
	flag.StringVar(&cfg.entrypoint, "entrypoint", "", "entrypoint path in the image (none when empty)")
	flag.StringVar(&cfg.user, "user", "", "UID[:GID] the image's processes run as (root when empty)")
	flag.StringVar(&rootfs, "rootfs", "", "host directory whose tree becomes the image's / (optional)")
	flag.Var(&files, "file", "HOST:DEST[:MODE] file to copy into the image (repeatable)")
	flag.Var(&links, "link", "DEST:TARGET symlink to create in the image (repeatable)")
	flag.Var(&env, "env", "KEY=VALUE in the image config (repeatable)")
	flag.Var(&labels, "label", "KEY=VALUE label in the image config (repeatable)")
	flag.Parse()
	if name == "" || out == "" || (len(files) == 0 && rootfs == "") {
		fmt.Fprintln(os.Stderr, "ociimage: --name, --out and --rootfs or at least one --file are required")
		flag.Usage()
		os.Exit(2)
	}
	cfg.env = env
	cfg.labels = map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			fmt.Fprintf(os.Stderr, "ociimage: --label %q: want KEY=VALUE\n", l)
			os.Exit(2)
		}
		cfg.labels[k] = v
	}
	entries, err := parseEntries(rootfs, files, links)
	if err == nil {
		err = build(name, out, cfg, entries)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ociimage: %v\n", err)
		os.Exit(1)
	}
}

// walkTree calls visit for every path below dir (not dir itself), parents first, with the
// path relative to dir.
func walkTree(dir string, visit func(p, rel string, d os.DirEntry, info os.FileInfo) error) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		return visit(p, rel, d, info)
	})
}

// rootfsEntries lists the tree below dir as image entries (dir itself is the image's /).
func rootfsEntries(dir string) ([]entry, error) {
	var entries []entry
	err := walkTree(dir, func(p, rel string, d os.DirEntry, info os.FileInfo) error {
		e := entry{dst: "/" + filepath.ToSlash(rel), mode: int64(info.Mode().Perm())}
		switch {
		case d.IsDir():
			e.dir = true
		case info.Mode()&os.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			e.link = link
			e.mode = 0o777
		case info.Mode().IsRegular():
			e.src = p
		default:
			return fmt.Errorf("--rootfs: %s is neither a file, a directory nor a symlink", p)
		}
		if info.Mode()&os.ModeSticky != 0 {
			e.mode |= 0o1000
		}
		entries = append(entries, e)
		return nil
	})
	return entries, err
}

func parseEntries(rootfs string, files, links []string) ([]entry, error) {
	var entries []entry
	if rootfs != "" {
		var err error
		if entries, err = rootfsEntries(rootfs); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 || !path.IsAbs(parts[1]) {
			return nil, fmt.Errorf("--file %q: want HOST:DEST[:MODE] with an absolute DEST", f)
		}
		st, err := os.Stat(parts[0])
		if err != nil {
			return nil, fmt.Errorf("--file %q: %w", f, err)
		}
		mode := int64(st.Mode().Perm())
		if len(parts) == 3 {
			if mode, err = strconv.ParseInt(parts[2], 8, 32); err != nil {
				return nil, fmt.Errorf("--file %q: mode %q is not octal", f, parts[2])
			}
		}
		entries = append(entries, entry{dst: path.Clean(parts[1]), src: parts[0], mode: mode})
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, ":")
		if !ok || !path.IsAbs(dst) || target == "" {
			return nil, fmt.Errorf("--link %q: want DEST:TARGET with an absolute DEST", l)
		}
		entries = append(entries, entry{dst: path.Clean(dst), link: target, mode: 0o777})
	}
	// Later entries (--file, --link) replace earlier ones (--rootfs) of the same path.
	byPath := map[string]entry{}
	for _, e := range entries {
		byPath[e.dst] = e
	}
	entries = entries[:0]
	for _, e := range byPath {
		entries = append(entries, e)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].dst < entries[j].dst })
	return entries, nil
}

func build(name, out string, ic imageConfig, entries []entry) error {
	layerTar, err := layerBytes(entries)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cfg, err := img.ConfigFile() // already lists the layer's diff ID
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Config = v1.Config{Env: ic.env, WorkingDir: "/", User: ic.user}
	if ic.entrypoint != "" {
		cfg.Config.Entrypoint = []string{ic.entrypoint}
	}
	if len(ic.labels) > 0 {
		cfg.Config.Labels = ic.labels
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	dir, err := os.MkdirTemp(filepath.Dir(out), ".ociimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	// containerd names the imported image from io.containerd.image.name, podman from ref.name.
	annotations := map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name,
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(annotations)); err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	return tarDirectory(dir, out)
}

// layerBytes writes the layer: parent directories first, then each entry, with fixed owners and
// times so the same files always give the same digest.
func layerBytes(entries []entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	for _, e := range entries {
		for _, d := range parents(e.dst) {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		hdr := &tar.Header{Name: strings.TrimPrefix(e.dst, "/"), Mode: e.mode, ModTime: epoch}
		if e.dir {
			if dirs[e.dst] {
				continue // written as a parent already, with 0755
			}
			dirs[e.dst] = true
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			continue
		}
		if e.src == "" {
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.link
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			continue
		}
		data, err := os.ReadFile(e.src)
		if err != nil {
			return nil, err
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// parents of /a/b/c are /a and /a/b.
func parents(p string) []string {
	var out []string
	for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
		out = append([]string{d}, out...)
	}
	return out
}

// tarDirectory writes the OCI layout in dir as the archive out (written aside, then renamed).
func tarDirectory(dir, out string) error {
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	err = walkTree(dir, func(p, rel string, d os.DirEntry, info os.FileInfo) error {
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = filepath.ToSlash(rel), 0, 0, "", ""
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil || d.IsDir() {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}
