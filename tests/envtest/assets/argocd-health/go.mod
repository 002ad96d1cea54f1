// Wrapper module that builds the Argo CD health-script evaluator for the GitOps tests.
module appservice-operator/envtest/argocd-health

go 1.26.0

require github.com/yuin/gopher-lua v1.1.2
