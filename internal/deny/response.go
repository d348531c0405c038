package deny

import (
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func admissionResponse(st metav1.Status) admissionv1.AdmissionResponse {
	return admissionv1.AdmissionResponse{Allowed: false, Result: &st}
}
