package values

import (
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/das-project/das/operator/api/v1alpha1"
)

// crdFile is the hand-written CRD of DASOperator.
const crdFile = "../../../deploy/olm/crd/operator.das.com_dasoperators.yaml"

// The CRD's schema and the Go types name the same fields, level by level: a field added to one
// and forgotten in the other would be pruned by the API server or refused by FromSpec.
func TestCRDSchemaMatchesTheGoTypes(t *testing.T) {
	raw, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
		t.Fatal(err)
	}
	gvk := v1alpha1.GroupVersionKind()
	if crd.Spec.Group != gvk.Group || crd.Spec.Names.Kind != gvk.Kind || crd.Spec.Scope != apiextensionsv1.ClusterScoped {
		t.Fatalf("CRD serves %s %s (%s), want cluster-scoped %s", crd.Spec.Group, crd.Spec.Names.Kind, crd.Spec.Scope, gvk)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != gvk.Version {
		t.Fatalf("CRD versions %v, want only %s", crd.Spec.Versions, gvk.Version)
	}
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	compare(t, "spec", spec, reflect.TypeOf(v1alpha1.DASOperatorSpec{}))
}

// compare checks that schema s describes Go type typ (struct fields by their json names).
func compare(t *testing.T, path string, s apiextensionsv1.JSONSchemaProps, typ reflect.Type) {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch typ.Kind() {
	case reflect.Struct:
		if typ.PkgPath() != reflect.TypeOf(v1alpha1.DASOperatorSpec{}).PkgPath() {
			return // a Kubernetes type (Toleration): its schema is a subset, checked by the API server
		}
		fields := map[string]reflect.Type{}
		for i := 0; i < typ.NumField(); i++ {
			name := strings.Split(typ.Field(i).Tag.Get("json"), ",")[0]
			fields[name] = typ.Field(i).Type
		}
		if got, want := keys(s.Properties), keysOf(fields); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: CRD properties %v, Go fields %v", path, got, want)
		}
		for name, ft := range fields {
			if p, ok := s.Properties[name]; ok {
				compare(t, path+"."+name, p, ft)
			}
		}
	case reflect.Slice:
		if s.Type != "array" || s.Items == nil || s.Items.Schema == nil {
			t.Errorf("%s: want an array schema, got %q", path, s.Type)
			return
		}
		compare(t, path+"[]", *s.Items.Schema, typ.Elem())
	case reflect.Map:
		if s.Type != "object" || s.AdditionalProperties == nil {
			t.Errorf("%s: want an object of additionalProperties", path)
		}
	case reflect.String:
		want(t, path, s.Type, "string")
	case reflect.Bool:
		want(t, path, s.Type, "boolean")
	case reflect.Int, reflect.Int32, reflect.Int64:
		want(t, path, s.Type, "integer")
	default:
		t.Errorf("%s: Go kind %s not handled", path, typ.Kind())
	}
}

func want(t *testing.T, path, got, want string) {
	if got != want {
		t.Errorf("%s: CRD type %q, Go wants %q", path, got, want)
	}
}

func keys(m map[string]apiextensionsv1.JSONSchemaProps) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func keysOf(m map[string]reflect.Type) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
