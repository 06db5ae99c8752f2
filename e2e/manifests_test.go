package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/server/egressselector"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// defaultManifestsDir holds the manifests an operator applies;
// E2E_MANIFESTS_DIR names another directory.
const defaultManifestsDir = "../examples/kubernetes"

// Scenario 10: every manifest under examples/kubernetes is accepted by the
// real API server (server-side apply, dry run: schema, unknown fields,
// validation and admission), and kube-apiserver configuration files there
// pass kube-apiserver's own loader and validation.
func TestManifestsApply(t *testing.T) {
	manifestsDir := defaultManifestsDir
	if d := os.Getenv("E2E_MANIFESTS_DIR"); d != "" {
		manifestsDir = d
	}
	if _, err := os.Stat(manifestsDir); errors.Is(err, fs.ErrNotExist) {
		t.Skip("examples/kubernetes not written yet")
	}
	var files []string
	require.NoError(t, filepath.WalkDir(manifestsDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			files = append(files, path)
		}
		return err
	}))
	require.NotEmpty(t, files, "%s exists but holds no YAML file", manifestsDir)

	mapper := restMapper(t)
	applied := 0
	for _, file := range files {
		rel, _ := filepath.Rel(manifestsDir, file)
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for doc := 1; ; doc++ {
			var obj unstructured.Unstructured
			err := dec.Decode(&obj.Object)
			if errors.Is(err, io.EOF) {
				break
			}
			if !assert.NoError(t, err, "%s document %d: not valid YAML", rel, doc) {
				break
			}
			if len(obj.Object) == 0 {
				continue
			}
			gvk := obj.GroupVersionKind()
			where := rel + " " + gvk.Kind + " " + obj.GetName()
			if gvk.Group == "kustomize.config.k8s.io" {
				continue // built and applied by TestKustomizeBuildApplies
			}
			if gvk.Group == "apiserver.k8s.io" && gvk.Kind == "EgressSelectorConfiguration" {
				// kube-apiserver configuration, not an API object: load it as
				// --egress-selector-config-file does.
				cfg, err := egressselector.ReadEgressSelectorConfiguration(file)
				if assert.NoError(t, err, where) {
					if assert.Empty(t, egressselector.ValidateEgressSelectorConfiguration(cfg), where) {
						t.Logf("%s: loaded and validated as kube-apiserver would", where)
					}
				}
				continue
			}
			if assert.NoError(t, dryRunApply(t, mapper, &obj), "%s: server-side apply (dry run)", where) {
				applied++
				t.Logf("%s: accepted (dry run)", where)
			}
			checkContainerFlags(t, where, &obj)
		}
	}
	assert.Positive(t, applied, "no API object found in %s", manifestsDir)
	t.Logf("%d objects accepted from %d files", applied, len(files))
}

// TestKustomizeBuildApplies builds examples/kubernetes as kubectl apply -k
// does (the kustomize library kubectl embeds) and applies the result, dry
// run, to the real API server; the same objects with a misspelled field
// are refused, so the check can fail.
func TestKustomizeBuildApplies(t *testing.T) {
	kustomizeApply(t, defaultManifestsDir)
	// The lease overlay: servers publish leases, agents count them and
	// dial through the load-balanced Service, no DNS.
	agentArgs := kustomizeApply(t, "../examples/kubernetes-leases")
	assert.Contains(t, agentArgs, "--count-server-leases")
	assert.NotContains(t, strings.Join(agentArgs, " "), "--server-count-dns")
	assert.Contains(t, agentArgs, "--proxy-server-host=konnectivity-server-lb.kube-system.svc.cluster.local")
}

// kustomizeApply builds dir and applies it as TestKustomizeBuildApplies
// says, and returns the agent container's args.
func kustomizeApply(t *testing.T, dir string) (agentArgs []string) {
	t.Helper()
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err, "kustomize build %s", dir)
	mapper := restMapper(t)
	var images []string
	for _, r := range resources.Resources() {
		b, err := r.AsYAML()
		require.NoError(t, err)
		obj := &unstructured.Unstructured{}
		require.NoError(t, yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096).Decode(&obj.Object))
		where := "kustomize " + obj.GetKind() + " " + obj.GetName()
		require.NoError(t, dryRunApply(t, mapper, obj), "%s: server-side apply (dry run)", where)
		containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			if image, ok := c.(map[string]any)["image"].(string); ok {
				images = append(images, image)
			}
			if obj.GetKind() == "DaemonSet" {
				agentArgs, _, _ = unstructured.NestedStringSlice(c.(map[string]any), "args")
			}
		}
		checkContainerFlags(t, where, obj)
		if obj.GetKind() == "Deployment" {
			require.NoError(t, unstructured.SetNestedField(obj.Object, int64(3), "spec", "replicass"))
			err := dryRunApply(t, mapper, obj)
			require.Error(t, err, "%s: a misspelled field must be refused", where)
			assert.Contains(t, err.Error(), "replicass")
		}
	}
	assert.ElementsMatch(t, []string{"ghcr.io/servercount/proxy-server:v0.1.0", "ghcr.io/servercount/proxy-agent:v0.1.0"}, images)
	t.Logf("kustomize build: %d objects accepted (dry run), images %v", resources.Size(), images)

	// And as an operator types it.
	ensureNamespace(t, "kube-system")
	out, err := exec.CommandContext(t.Context(), the.kubectl, "--kubeconfig", the.cluster.Kubeconfig,
		"apply", "-k", dir, "--dry-run=server").CombinedOutput()
	require.NoError(t, err, "kubectl apply -k --dry-run=server:\n%s", out)
	t.Logf("kubectl apply -k %s --dry-run=server:\n%s", dir, out)
	return agentArgs
}

// restMapper maps kinds to the resources the API server serves.
func restMapper(t *testing.T) meta.RESTMapper {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(the.cluster.REST)
	require.NoError(t, err)
	groups, err := restmapper.GetAPIGroupResources(dc)
	require.NoError(t, err)
	return restmapper.NewDiscoveryRESTMapper(groups)
}

// dryRunApply applies obj to the API server, server side, as a dry run:
// schema, unknown fields, validation and admission.
func dryRunApply(t *testing.T, mapper meta.RESTMapper, obj *unstructured.Unstructured) error {
	t.Helper()
	gvk := obj.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("the API server does not serve %s: %w", gvk, err)
	}
	ri := the.cluster.Dynamic.Resource(mapping.Resource)
	opts := metav1.ApplyOptions{FieldManager: "servercount-e2e", DryRun: []string{metav1.DryRunAll}, Force: true}
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		_, err = ri.Apply(t.Context(), obj.GetName(), obj, opts)
		return err
	}
	ns := obj.GetNamespace()
	if ns == "" {
		ns = "default"
	}
	ensureNamespace(t, ns)
	_, err = ri.Namespace(ns).Apply(t.Context(), obj.GetName(), obj, opts)
	return err
}

// checkContainerFlags runs our binary for each container of a workload that
// runs /proxy-server or /proxy-agent, with the manifest's args: the flags
// must parse (exit status 2 is a usage error). Start-up then fails on the
// missing certificate or kubeconfig files, or is stopped after a few
// seconds, in the suite's network namespace.
func checkContainerFlags(t *testing.T, where string, obj *unstructured.Unstructured) {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		c, _ := c.(map[string]any)
		command, _, _ := unstructured.NestedStringSlice(c, "command")
		args, _, _ := unstructured.NestedStringSlice(c, "args")
		if len(command) == 0 {
			continue
		}
		var bin string
		switch filepath.Base(command[0]) {
		case "proxy-server":
			bin = the.bin.Server
		case "proxy-agent":
			bin = the.bin.Agent
		default:
			continue
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		cmd := exec.CommandContext(ctx, bin, append(command[1:], args...)...)
		out, _ := cmd.CombinedOutput()
		cancel()
		// Exit status 2 is a start-up error naming its flag: here only the
		// files and the in-cluster API the pod would have may be missing.
		if cmd.ProcessState.ExitCode() == 2 {
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				assert.True(t, strings.Contains(line, "no such file or directory") || strings.Contains(line, "in-cluster"),
					"%s: %s refuses the manifest's flags: %s", where, command[0], line)
			}
		}
		t.Logf("%s: %s accepts the manifest's %d args", where, command[0], len(args))
	}
}

// ensureNamespace creates namespace ns for real if it does not exist, as
// objects in it cannot be dry-run otherwise.
func ensureNamespace(t *testing.T, ns string) {
	t.Helper()
	_, err := the.cluster.Client.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = the.cluster.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
	}
	require.NoError(t, err, "namespace %s", ns)
}
