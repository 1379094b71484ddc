//! The shm size flag and the mount table as [`crate::mps::shm`] reads them (pure). The mounts
//! themselves are `driver/tests/mps_shm.rs`'s (they need root).

use std::path::Path;

use crate::mps::shm::{
    MIN_SIZE_BYTES, Shm, is_shared, mount_containing, mount_data, mount_on, parse_mountinfo,
};

#[test]
fn the_shm_size_is_a_quantity_rounded_up_to_pages_and_0_is_a_plain_directory() {
    assert_eq!(
        Shm::parse("8Gi"),
        Ok(Shm::Tmpfs {
            size_bytes: 8 << 30
        })
    );
    assert_eq!(Shm::parse("0"), Ok(Shm::Directory));
    assert_eq!(
        Shm::parse("1Mi").unwrap().size_bytes(),
        Some(MIN_SIZE_BYTES)
    );
    // One byte over a page boundary takes the whole page.
    assert_eq!(
        Shm::parse("1048577").unwrap().size_bytes(),
        Some(1048576 + 4096)
    );
    assert_eq!(Shm::parse("1.5Mi").unwrap().size_bytes(), Some(1536 << 10));
    assert_eq!(Shm::Directory.size_bytes(), None);
    for (bad, says) in [
        ("lots", "not a quantity"),
        ("100Ki", "less than 1Mi"),
        ("-1Gi", "negative"),
        ("", "no number"),
    ] {
        let e = Shm::parse(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
        assert!(e.contains("valid: a Kubernetes quantity"), "{e}");
        assert!(e.contains("0 for a plain directory"), "{e}");
    }
}

#[test]
fn the_tmpfs_is_mounted_with_its_size_and_the_mode_of_dev_shm() {
    assert_eq!(mount_data(8 << 30), "size=8589934592,mode=1777");
}

const MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
90 27 0:50 / /var/lib/das rw,relatime shared:40 master:3 - ext4 /dev/vdb rw
91 90 0:51 / /var/lib/das/mps/0123456789abcdef/shm rw,nosuid,nodev,noexec,relatime shared:41 - tmpfs das-mps-shm rw,size=65536k,mode=1777
92 27 0:52 / /mnt/with\\040space rw,relatime - tmpfs none rw
93 90 0:53 / /var/lib/das/mps/0123456789abcdef/shm rw,relatime - tmpfs das-mps-shm rw,size=1024k,mode=1777
this line is not a mount
";

#[test]
fn mountinfo_tells_the_mount_on_a_path_the_one_on_top() {
    let entries = parse_mountinfo(MOUNTINFO);
    assert_eq!(entries.len(), 6, "{entries:?}");
    let shm = Path::new("/var/lib/das/mps/0123456789abcdef/shm");
    let top = mount_on(&entries, shm).expect("mounted");
    assert_eq!(top.fs_type, "tmpfs");
    assert_eq!(
        top.super_options, "rw,size=1024k,mode=1777",
        "the last listed is on top"
    );
    assert!(mount_on(&entries, Path::new("/var/lib/das/mps")).is_none());
    // Escaped blanks are read back.
    assert!(mount_on(&entries, Path::new("/mnt/with space")).is_some());
}

#[test]
fn the_mount_a_path_lies_on_tells_whether_it_propagates() {
    let entries = parse_mountinfo(MOUNTINFO);
    let state = mount_containing(&entries, Path::new("/var/lib/das/mps")).unwrap();
    assert_eq!(state.mount_point, Path::new("/var/lib/das"));
    assert!(is_shared(state), "shared:40 master:3");
    let root = mount_containing(&entries, Path::new("/srv/das")).unwrap();
    assert_eq!(root.mount_point, Path::new("/"));
    let private = parse_mountinfo("27 1 254:0 / / rw,relatime - ext4 /dev/vda rw");
    assert!(!is_shared(
        mount_containing(&private, Path::new("/var/lib/das")).unwrap()
    ));
}

#[test]
fn a_mount_refused_for_privilege_says_what_to_do() {
    let e = crate::mps::shm::ShmError::NotPermitted {
        path: "/var/lib/das/mps/0123456789abcdef/shm".into(),
        size_bytes: 8 << 30,
        source: rustix::io::Errno::PERM,
    }
    .to_string();
    for says in [
        "/var/lib/das/mps/0123456789abcdef/shm",
        "8589934592-byte tmpfs",
        "CAP_SYS_ADMIN",
        "privileged",
        "mps.shmOnEmulatedGpus",
        "--mps-shm-size=0",
    ] {
        assert!(e.contains(says), "{says}: {e}");
    }
}
