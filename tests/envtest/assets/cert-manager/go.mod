// Wrapper module that pins cert-manager, whose CRDs (deploy/crds in its module zip) the
// exposure tests install: its controller cannot be built here (its cmd/ modules are not
// served), so a Certificate the controller writes is checked against the CRD's schema.
module appservice-operator/envtest/cert-manager

go 1.26.0

require github.com/cert-manager/cert-manager v1.21.2
