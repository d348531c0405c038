package main

import (
	"io"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// printFlags are the -o flags of a command that prints objects; withName
// allows -o name, for API objects only.
func printFlags(withName bool) *genericclioptions.PrintFlags {
	pf := genericclioptions.NewPrintFlags("")
	if !withName {
		pf.NamePrintFlags = nil
	}
	return pf
}

// toPrinter returns the printer -o asks for, or nil for the table.
func toPrinter(pf *genericclioptions.PrintFlags) (printers.ResourcePrinter, error) {
	if *pf.OutputFormat == "" && (pf.TemplatePrinterFlags.TemplateArgument == nil || *pf.TemplatePrinterFlags.TemplateArgument == "") {
		return nil, nil
	}
	return pf.ToPrinter()
}

// printObject prints obj with p as an object of the given kind in
// locking.lockwarden.io/v1alpha1; obj is a LockGrant, a LockGrantList or a
// resourceStatus. Every -o output of the plugin goes through it.
//
// obj is handed to p in its unstructured form, whose integers are int64, as
// kubectl get hands the printers what it decoded. The jsonpath printer
// reads a typed object through encoding/json into float64s, which print
// fences of 2^53 and above rounded (9.007199254740992e+15): a fence
// printed that way names no grant, and a guarded write that carries it is
// refused.
func printObject(p printers.ResourcePrinter, obj any, kind string, w io.Writer) error {
	if o, ok := obj.(runtime.Object); ok {
		setKind(o)
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(lockingv1alpha1.GroupVersion.WithKind(kind))
	return p.PrintObj(u, w)
}
