package tlsprofile

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	configv1 "github.com/openshift/api/config/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
)

var intermediate = configv1.TLSProfiles[configv1.TLSProfileIntermediateType]

func TestEachProfileTypeResolvesToOpenShiftsTable(t *testing.T) {
	for _, c := range []struct {
		profile *configv1.TLSSecurityProfile
		name    string
		min     string
		ciphers []string
	}{
		{nil, "Intermediate (unset: OpenShift's default)", "VersionTLS12", intermediate.Ciphers},
		{&configv1.TLSSecurityProfile{}, "Intermediate (unset: OpenShift's default)", "VersionTLS12", intermediate.Ciphers},
		{&configv1.TLSSecurityProfile{Type: configv1.TLSProfileOldType, Old: &configv1.OldTLSProfile{}},
			"Old", "VersionTLS10", configv1.TLSProfiles[configv1.TLSProfileOldType].Ciphers},
		{&configv1.TLSSecurityProfile{Type: configv1.TLSProfileIntermediateType},
			"Intermediate", "VersionTLS12", intermediate.Ciphers},
		{&configv1.TLSSecurityProfile{Type: configv1.TLSProfileModernType},
			"Modern", "VersionTLS13", []string{"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}},
		{&configv1.TLSSecurityProfile{Type: configv1.TLSProfileCustomType, Custom: &configv1.CustomTLSProfile{
			TLSProfileSpec: configv1.TLSProfileSpec{Ciphers: []string{"ECDHE-RSA-AES128-GCM-SHA256"}, MinTLSVersion: configv1.VersionTLS11}}},
			"Custom", "VersionTLS11", []string{"ECDHE-RSA-AES128-GCM-SHA256"}},
		{&configv1.TLSSecurityProfile{Type: configv1.TLSProfileCustomType},
			"Intermediate (Custom without parameters)", "VersionTLS12", intermediate.Ciphers},
		{&configv1.TLSSecurityProfile{Type: "Future"}, `Intermediate (unknown type "Future")`, "VersionTLS12", intermediate.Ciphers},
	} {
		got := FromAPIServer(c.profile)
		if got.Name != c.name || got.MinTLSVersion != c.min || !reflect.DeepEqual(got.Ciphers, c.ciphers) {
			t.Errorf("%+v: got %+v, want %s %s %v", c.profile, got, c.name, c.min, c.ciphers)
		}
	}
}

func webhook(t *testing.T, p Profile) Webhook {
	t.Helper()
	w, err := ForWebhook(p.MinTLSVersion, p.Ciphers, p.Name)
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	return w
}

func TestProfilesFitDASWebhook(t *testing.T) {
	// Intermediate, the default: passed through as it is.
	w := webhook(t, FromAPIServer(nil))
	if w.MinVersion != VersionTLS12 || !reflect.DeepEqual(w.CipherSuites, intermediate.Ciphers) {
		t.Errorf("Intermediate: %+v", w)
	}
	// Modern: TLS 1.3 only, its three suites.
	w = webhook(t, FromAPIServer(&configv1.TLSSecurityProfile{Type: configv1.TLSProfileModernType}))
	if w.MinVersion != VersionTLS13 || len(w.CipherSuites) != 3 || len(w.Notes) != 0 {
		t.Errorf("Modern: %+v", w)
	}
	// Old: TLS 1.0 raised to 1.2, said so; the list passed through, its CBC and static-RSA
	// suites counted as not offered.
	old := FromAPIServer(&configv1.TLSSecurityProfile{Type: configv1.TLSProfileOldType})
	w = webhook(t, old)
	if w.MinVersion != VersionTLS12 || !reflect.DeepEqual(w.CipherSuites, old.Ciphers) {
		t.Errorf("Old: %+v", w)
	}
	if len(w.Notes) != 2 || !strings.Contains(w.Notes[0], "asks for VersionTLS10") ||
		!strings.Contains(w.Notes[1], "are not offered") {
		t.Errorf("Old notes: %q", w.Notes)
	}
	if s := w.Summary(); !strings.Contains(s, "minimum VersionTLS12") || !strings.Contains(s, "VersionTLS10") {
		t.Errorf("Old summary: %s", s)
	}
}

func TestCustomProfiles(t *testing.T) {
	custom := func(min configv1.TLSProtocolVersion, ciphers ...string) Profile {
		return FromAPIServer(&configv1.TLSSecurityProfile{Type: configv1.TLSProfileCustomType,
			Custom: &configv1.CustomTLSProfile{TLSProfileSpec: configv1.TLSProfileSpec{Ciphers: ciphers, MinTLSVersion: min}}})
	}
	// TLS 1.1 raised; IANA and OpenSSL names both count as implemented.
	w := webhook(t, custom(configv1.VersionTLS11, "ECDHE-ECDSA-CHACHA20-POLY1305", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"))
	if w.MinVersion != VersionTLS12 || len(w.CipherSuites) != 2 || len(w.Notes) != 1 {
		t.Errorf("Custom TLS 1.1: %+v", w)
	}
	// TLS 1.3 with TLS 1.2 suites only (OpenShift does not configure TLS 1.3 suites): the
	// list is dropped, das-webhook offers its TLS 1.3 defaults.
	w = webhook(t, custom(configv1.VersionTLS13, "ECDHE-RSA-AES128-GCM-SHA256"))
	if w.MinVersion != VersionTLS13 || w.CipherSuites != nil || len(w.Notes) != 1 {
		t.Errorf("Custom TLS 1.3 with TLS 1.2 suites: %+v", w)
	}
	// No minimum, no ciphers: das-webhook's defaults.
	w = webhook(t, custom(""))
	if w.MinVersion != "" || w.CipherSuites != nil || len(w.Notes) != 0 {
		t.Errorf("empty Custom: %+v", w)
	}
	// Only suites das-webhook lacks: it would not start, so the operator refuses.
	p := custom(configv1.VersionTLS12, "ECDHE-RSA-AES128-SHA256", "DHE-RSA-AES256-GCM-SHA384")
	if _, err := ForWebhook(p.MinTLSVersion, p.Ciphers, p.Name); err == nil ||
		!strings.Contains(err.Error(), "no TLS cipher suite das-webhook implements") ||
		!strings.Contains(err.Error(), "ECDHE-RSA-AES128-GCM-SHA256") {
		t.Errorf("CBC and DHE only: %v", err)
	}
	if _, err := ForWebhook("VersionTLS14", nil, "Custom"); err == nil {
		t.Error("VersionTLS14 accepted")
	}
}

// webhookSuites is webhook/src/tls/policy.rs's NAMES: a suite das-webhook gains or loses there
// must change here, or the operator's check of a profile's suites is wrong.
func TestWebhookSuitesAreDASWebhooks(t *testing.T) {
	src, err := os.ReadFile("../../../webhook/src/tls/policy.rs")
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	start := strings.Index(text, "const NAMES: &[(&str, &str)] = &[")
	end := strings.Index(text[start:], "];")
	if start < 0 || end < 0 {
		t.Fatal("NAMES not found in webhook/src/tls/policy.rs")
	}
	pairs := regexp.MustCompile(`\(\s*"([^"]+)",\s*"([^"]+)",?\s*\)`).FindAllStringSubmatch(text[start:start+end], -1)
	var got [][2]string
	for _, p := range pairs {
		got = append(got, [2]string{p[1], p[2]})
	}
	var want [][2]string
	for _, s := range webhookSuites {
		want = append(want, [2]string{s.iana, s.openssl})
		if s.tls13 == strings.Contains(s.iana, "_WITH_") { // TLS 1.2 suites name their key exchange
			t.Errorf("%s: tls13 %v", s.iana, s.tls13)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("policy.rs NAMES %v, webhookSuites %v", got, want)
	}
}

// Each change is said once: the translator runs at every reconcile.
func TestAnnouncerSaysEachChangeOnce(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	a := &Announcer{Log: logr.Discard(), Recorder: rec}
	obj := &corev1.ConfigMap{} // any object: the fake recorder does not look at it
	modern := webhook(t, FromAPIServer(&configv1.TLSSecurityProfile{Type: configv1.TLSProfileModernType}))
	old := webhook(t, FromAPIServer(&configv1.TLSSecurityProfile{Type: configv1.TLSProfileOldType}))
	for _, w := range []Webhook{modern, modern, old, old, modern} {
		a.Announce(obj, w)
	}
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		got = append(got, strings.Join(strings.Fields(e)[:2], " "))
	}
	want := []string{"Normal WebhookTLSProfile", "Warning WebhookTLSProfileAdjusted", "Normal WebhookTLSProfile"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
}
